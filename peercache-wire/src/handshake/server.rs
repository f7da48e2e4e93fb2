//! The server's side of the handshake, without I/O.

use super::{
    AUTH_REASON_PREFIX, Acceptor, AuthChallenge, AuthProof, EXT_AUTH_NONCE, EXT_HANDSHAKE_VERSION,
    EXT_NODE_CERT, EXT_NODE_SIGNATURE, EXT_SERVER_PROOF, HANDSHAKE_VERSION, Hello, HelloReply,
    SEAL_REASON_PREFIX, Step, accept, version_reason,
};
use crate::WireError;
use crate::auth::{self, Grant, Side, TAG_LEN};
use crate::envelope::{self, Envelope, Extension};

/// The server's side of the handshake, without I/O. In an authenticated cluster it sends
/// nothing that depends on the secret until the client has proven it.
#[derive(Debug)]
pub struct ServerHandshake<'a> {
    acceptor: &'a Acceptor,
    pending: Option<Pending>,
    /// The acceptor's key the client proved (answered with the same key).
    key: usize,
    /// The connection's keys once the handshake agreed to seal it.
    channel: Option<crate::seal::ChannelKeys>,
    /// The client proved the node id its Hello names.
    verified: bool,
}

#[derive(Debug)]
struct Pending {
    hello: Hello,
    hello_frame: Vec<u8>,
    client_nonce: [u8; TAG_LEN],
    server_nonce: [u8; TAG_LEN],
}

/// The handshake version a Hello announces (1 when it carries none).
fn hello_version(env: &Envelope<'_>) -> Result<u8, WireError> {
    Ok(match env.extension(EXT_HANDSHAKE_VERSION)? {
        Some([v, ..]) => *v,
        _ => 1,
    })
}

impl<'a> ServerHandshake<'a> {
    /// A server handshake answering as `acceptor`.
    pub fn new(acceptor: &'a Acceptor) -> Self {
        ServerHandshake {
            acceptor,
            pending: None,
            key: 0,
            channel: None,
            verified: false,
        }
    }

    /// What the client's proof granted it: [`Grant::ReadOnly`] for a read-only client token
    /// (on an endpoint that accepts one), else [`Grant::Full`]. Meaningful once accepted.
    pub fn grant(&self) -> Grant {
        self.acceptor.auth.grant_of(self.key)
    }

    /// The connection's keys when the handshake agreed to seal it (after it finished).
    pub fn channel(&self) -> Option<crate::seal::ChannelKeys> {
        self.channel.clone()
    }

    /// Whether the client proved the node id its Hello names (after it finished).
    pub fn verified(&self) -> bool {
        self.verified
    }

    /// Checks the client's node certificate and signature (its proof of the secret already
    /// checked): Ok(true) proven, Ok(false) nothing to prove, Err(why) to refuse.
    fn check_client_identity(&self, p: &Pending, proof: &Envelope<'_>) -> Result<bool, String> {
        let (Some(id), Some(node)) = (self.acceptor.auth.identity(), p.hello.node.as_ref()) else {
            return Ok(false);
        };
        let hello = Envelope::parse(&p.hello_frame).map_err(|e| e.to_string())?;
        let cert = hello.extension(EXT_NODE_CERT).map_err(|e| e.to_string())?;
        let sig = proof
            .extension(EXT_NODE_SIGNATURE)
            .map_err(|e| e.to_string())?;
        match (cert, sig) {
            (Some(cert), Some(sig)) => {
                let msg = super::identity_message(
                    b"client",
                    &p.client_nonce,
                    &p.server_nonce,
                    &[&p.hello_frame],
                );
                id.check(node, cert, &msg, sig)
                    .map(|()| true)
                    .map_err(|e| format!("node certificate refused: {e}"))
            }
            _ if id.requires() => Err(format!(
                "this cluster requires node certificates and the hello names node {node} \
                 without one"
            )),
            _ => Ok(false),
        }
    }

    /// Whether this connection is to be sealed, or the reason it cannot be accepted.
    fn seal(&self, hello: &Hello) -> Result<bool, String> {
        if !hello.plane.seals() {
            return Ok(false);
        }
        crate::seal::agree(hello.features, self.acceptor.auth.seal_features())
            .map_err(|why| format!("{SEAL_REASON_PREFIX}: {why}"))
    }

    /// Answers `hello`; with `proven`, the exchange the client proved, the acceptance carries
    /// the server's own proof over it (and, when the two sides agree to seal, the sealing
    /// feature, from which both derive the connection's keys).
    fn finish(&mut self, hello: Hello, proven: Option<&Pending>) -> Result<Step<Hello>, WireError> {
        let a = self.acceptor;
        let mut reply = accept(&hello, &a.planes, a.node.clone(), a.incarnation);
        let mut sealed = false;
        if let HelloReply::Accept { features, .. } = &mut reply {
            match self.seal(&hello) {
                Ok(s) => {
                    sealed = s && proven.is_some();
                    if sealed {
                        *features |= crate::seal::FEATURE_SEAL;
                    }
                }
                Err(reason) => reply = HelloReply::Reject { reason },
            }
        }
        let mut frame = envelope::encode(&reply, &[])?;
        if let (Some(p), HelloReply::Accept { .. }) = (proven, &reply) {
            let body = Envelope::parse(&frame)?.body;
            if sealed {
                self.channel = a.auth.channel_keys(
                    self.key,
                    &p.client_nonce,
                    &p.server_nonce,
                    &[&p.hello_frame, body],
                );
            }
            let proof = a
                .auth
                .proof_with(
                    self.key,
                    Side::Server,
                    &p.client_nonce,
                    &p.server_nonce,
                    &[&p.hello_frame, body],
                )
                .unwrap_or([0; TAG_LEN]);
            let mut exts = vec![Extension {
                tag: EXT_SERVER_PROOF,
                data: proof.to_vec(),
            }];
            // A server that names its node proves it with its certificate, when it has one.
            if let (Some(_), Some(id)) = (a.node.as_ref(), a.auth.identity())
                && let (Some(cert), Some(sig)) = (
                    id.cert_bytes(),
                    id.sign(&super::identity_message(
                        b"server",
                        &p.client_nonce,
                        &p.server_nonce,
                        &[&p.hello_frame, body],
                    )),
                )
            {
                exts.push(Extension {
                    tag: EXT_NODE_CERT,
                    data: cert.to_vec(),
                });
                exts.push(Extension {
                    tag: EXT_NODE_SIGNATURE,
                    data: sig.to_vec(),
                });
            }
            frame = envelope::encode(&reply, &exts)?;
        }
        let result = match reply {
            HelloReply::Accept { .. } => Ok(hello),
            HelloReply::Reject { reason } => Err(WireError::Handshake(reason)),
        };
        Ok(Step::Finish(frame, result))
    }

    fn refuse(&self, why: &str) -> Result<Step<Hello>, WireError> {
        self.acceptor.auth.count_rejection(why);
        let reason = format!("{AUTH_REASON_PREFIX} failed: {why}");
        let frame = envelope::encode(
            &HelloReply::Reject {
                reason: reason.clone(),
            },
            &[],
        )?;
        Ok(Step::Finish(frame, Err(WireError::Unauthenticated(reason))))
    }

    fn refuse_version(&self, client: u8) -> Result<Step<Hello>, WireError> {
        self.acceptor
            .auth
            .count_rejection("the client runs the previous handshake version");
        let frame = envelope::encode(
            &HelloReply::Reject {
                reason: version_reason(client),
            },
            &[],
        )?;
        Ok(Step::Finish(
            frame,
            Err(WireError::HandshakeVersion {
                ours: HANDSHAKE_VERSION,
                theirs: client,
            }),
        ))
    }

    /// The connection ended (closed, timed out) before the exchange finished. A client that
    /// was challenged and left without a proof counts as a refused stranger.
    pub fn abandoned(&mut self) {
        if self.pending.take().is_some() {
            self.acceptor
                .auth
                .count_rejection("left after the challenge without a proof");
        }
    }

    /// Feeds the client's next frame.
    pub fn on_frame(&mut self, frame: &[u8]) -> Result<Step<Hello>, WireError> {
        if let Some(p) = self.pending.take() {
            return self.on_proof(p, frame);
        }
        let env = Envelope::parse(frame)?;
        let hello: Hello = env.decode()?;
        let auth = &self.acceptor.auth;
        if !auth.is_enabled() {
            // Without a secret nothing changed between versions: both talk.
            return self.finish(hello, None);
        }
        let version = hello_version(&env)?;
        if version < HANDSHAKE_VERSION {
            return self.refuse_version(version);
        }
        let client_nonce = match env.extension(EXT_AUTH_NONCE)? {
            Some(n) if n.len() == TAG_LEN => {
                let mut a = [0; TAG_LEN];
                a.copy_from_slice(n);
                a
            }
            Some(_) => return self.refuse("malformed nonce"),
            None => return self.refuse("this cluster requires a cluster_secret"),
        };
        let server_nonce = auth::nonce()?;
        self.pending = Some(Pending {
            hello,
            hello_frame: frame.to_vec(),
            client_nonce,
            server_nonce,
        });
        Ok(Step::Send(envelope::encode(
            &AuthChallenge {
                nonce: server_nonce,
            },
            &[],
        )?))
    }

    fn on_proof(&mut self, p: Pending, frame: &[u8]) -> Result<Step<Hello>, WireError> {
        let env = match Envelope::parse(frame) {
            Ok(e) => e,
            Err(_) => return self.refuse("expected an authentication proof"),
        };
        let proof = match env.decode::<AuthProof>() {
            Ok(p) => p,
            Err(_) => return self.refuse("expected an authentication proof"),
        };
        match self.acceptor.auth.verify_key(
            Side::Client,
            &p.client_nonce,
            &p.server_nonce,
            &[&p.hello_frame],
            &proof.proof,
        ) {
            Some(key) => self.key = key,
            None => return self.refuse("wrong proof (different cluster_secret, or a replay)"),
        }
        match self.check_client_identity(&p, &env) {
            Ok(v) => self.verified = v,
            Err(why) => return self.refuse(&why),
        }
        let hello = p.hello.clone();
        self.finish(hello, Some(&p))
    }
}
