//! Where a latency bench's threads run. A request/response between two threads costs very
//! different times depending on whether the scheduler puts both ends on one CPU (two context
//! switches) or on two (two wake-ups, each a halted vCPU's exit on a VM): on a 2-vCPU guest,
//! 5–10 µs against 55–84 µs for the same loopback round trip. A ratio between two rows is only
//! meaningful when both rows cross the same boundary, so [`Placement::Split`] puts every server
//! thread (nodes, echo servers) on the CPUs after the first allowed one and the calling thread
//! on the first: every round trip crosses CPUs, as a request to another host does.

use std::io;

/// How a bench places its threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Placement {
    /// Servers on every allowed CPU but the first, the caller on the first (needs 2 or more).
    Split,
    /// Wherever the scheduler puts them.
    Os,
}

/// The CPUs this thread may run on, in order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: a zeroed `cpu_set_t` is a valid empty set that sched_getaffinity fills, reading
    // and writing exactly `size_of` bytes; CPU_ISSET reads inside it for indices below
    // CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect())
    }
}

/// Pins the calling thread to `cpus`; threads it starts afterwards inherit that.
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() || cpus.iter().any(|&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no CPU set to pin to in {cpus:?}"),
        ));
    }
    // SAFETY: a zeroed `cpu_set_t` is the empty set; CPU_SET writes inside it for indices
    // below CPU_SETSIZE (checked above), and sched_setaffinity reads exactly `size_of` bytes.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A split placement's two sides: `caller` (the first allowed CPU) and `servers` (the rest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The calling thread's CPU.
    pub caller: usize,
    /// The server threads' CPUs.
    pub servers: Vec<usize>,
}

impl Split {
    /// The split of the CPUs this thread may use; an error naming why when there is no second
    /// CPU.
    pub fn of_allowed() -> io::Result<Split> {
        let cpus = allowed_cpus()?;
        match cpus.split_first() {
            Some((&caller, rest)) if !rest.is_empty() => Ok(Split {
                caller,
                servers: rest.to_vec(),
            }),
            _ => Err(io::Error::other(format!(
                "--placement split needs 2 or more CPUs; this process may use {cpus:?} \
                 (use --placement os)"
            ))),
        }
    }

    /// Runs `start` with the calling thread pinned to the server CPUs (so every thread it
    /// starts runs there), then pins the calling thread to the caller CPU.
    pub fn start_servers<T>(&self, start: impl FnOnce() -> T) -> io::Result<T> {
        pin_current_thread(&self.servers)?;
        let out = start();
        pin_current_thread(&[self.caller])?;
        Ok(out)
    }

    /// `"caller 0, servers 1-3"`.
    pub fn describe(&self) -> String {
        let s = &self.servers;
        let servers = match (s.first(), s.last()) {
            (Some(a), Some(b)) if s.len() > 1 && b - a + 1 == s.len() => format!("{a}-{b}"),
            _ => format!("{s:?}"),
        };
        format!("caller {}, servers {servers}", self.caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_pins_servers_apart_from_the_caller_and_threads_inherit_it() {
        let Ok(split) = Split::of_allowed() else {
            return; // one CPU: nothing to split (the error names why; checked below)
        };
        assert!(!split.servers.contains(&split.caller));
        let child = split
            .start_servers(|| std::thread::spawn(allowed_cpus))
            .unwrap();
        assert_eq!(child.join().unwrap().unwrap(), split.servers);
        assert_eq!(allowed_cpus().unwrap(), vec![split.caller]);
        pin_current_thread(&[split.caller]).unwrap();
        assert!(pin_current_thread(&[]).is_err());
        assert!(pin_current_thread(&[libc::CPU_SETSIZE as usize]).is_err());
    }

    #[test]
    fn the_description_names_a_range_or_a_list() {
        let s = Split {
            caller: 0,
            servers: vec![1, 2, 3],
        };
        assert_eq!(s.describe(), "caller 0, servers 1-3");
        let s = Split {
            caller: 2,
            servers: vec![5, 7],
        };
        assert_eq!(s.describe(), "caller 2, servers [5, 7]");
    }
}
