//! The client's side of the handshake, without I/O.

use super::{
    AUTH_REASON_PREFIX, Accepted, AuthChallenge, AuthChallengeV1, AuthProof, EXT_AUTH_NONCE,
    EXT_HANDSHAKE_VERSION, EXT_NODE_CERT, EXT_NODE_SIGNATURE, EXT_SERVER_PROOF, HANDSHAKE_VERSION,
    Hello, HelloReply, SEAL_REASON_PREFIX, Step, VERSION_REASON_PREFIX,
};
use crate::WireError;
use crate::auth::{self, Auth, Side, TAG_LEN};
use crate::envelope::{self, Envelope, Extension, Message};

/// The client's side of the handshake, without I/O: prove the secret when challenged, then
/// check the server's proof on its acceptance.
#[derive(Debug)]
pub struct ClientHandshake {
    auth: Auth,
    /// The sealing features the Hello announced (0: this plane is never sealed).
    seal: u64,
    hello_frame: Vec<u8>,
    nonce: [u8; TAG_LEN],
    /// The server's nonce, once challenged.
    server_nonce: Option<[u8; TAG_LEN]>,
}

impl ClientHandshake {
    /// Starts a handshake; returns the state and the first frame to send.
    pub fn new(hello: &Hello, auth: &Auth) -> Result<(Self, Vec<u8>), WireError> {
        let nonce = if auth.is_enabled() {
            auth::nonce()?
        } else {
            [0; TAG_LEN]
        };
        let mut exts = vec![Extension {
            tag: EXT_HANDSHAKE_VERSION,
            data: vec![HANDSHAKE_VERSION],
        }];
        if auth.is_enabled() {
            exts.push(Extension {
                tag: EXT_AUTH_NONCE,
                data: nonce.to_vec(),
            });
        }
        // A Hello that names a node presents the node's certificate, when it has one.
        if let (Some(_), Some(cert)) = (
            hello.node.as_ref(),
            auth.identity().and_then(|i| i.cert_bytes()),
        ) {
            exts.push(Extension {
                tag: EXT_NODE_CERT,
                data: cert.to_vec(),
            });
        }
        let seal = if hello.plane.seals() {
            auth.seal_features()
        } else {
            0
        };
        let hello = Hello {
            features: hello.features | seal,
            ..hello.clone()
        };
        let hello_frame = envelope::encode(&hello, &exts)?;
        let hs = ClientHandshake {
            auth: auth.clone(),
            seal,
            hello_frame: hello_frame.clone(),
            nonce,
            server_nonce: None,
        };
        Ok((hs, hello_frame))
    }

    /// The nonce this client sent (zero without a secret).
    pub fn nonce(&self) -> &[u8; TAG_LEN] {
        &self.nonce
    }

    /// Feeds the server's next frame.
    pub fn on_frame(&mut self, frame: &[u8]) -> Result<Step<Accepted>, WireError> {
        let env = Envelope::parse(frame)?;
        match env.kind {
            AuthChallengeV1::KIND => Err(WireError::HandshakeVersion {
                ours: HANDSHAKE_VERSION,
                theirs: 1,
            }),
            AuthChallenge::KIND => self.on_challenge(env.decode()?),
            _ => self.on_reply(&env),
        }
    }

    fn on_challenge(&mut self, ch: AuthChallenge) -> Result<Step<Accepted>, WireError> {
        if !self.auth.is_enabled() {
            return Err(WireError::Unauthenticated(
                "the server requires a cluster_secret and none is configured here".into(),
            ));
        }
        if self.server_nonce.is_some() {
            return Err(WireError::Handshake(
                "second authentication challenge".into(),
            ));
        }
        self.server_nonce = Some(ch.nonce);
        let proof = self
            .auth
            .proof(Side::Client, &self.nonce, &ch.nonce, &[&self.hello_frame])
            .unwrap_or([0; TAG_LEN]);
        // With a certificate presented, the node key signs the exchange too.
        let signature = Envelope::parse(&self.hello_frame)?
            .extension(EXT_NODE_CERT)?
            .and_then(|_| self.auth.identity())
            .and_then(|id| {
                id.sign(&super::identity_message(
                    b"client",
                    &self.nonce,
                    &ch.nonce,
                    &[&self.hello_frame],
                ))
            });
        let exts: Vec<Extension> = signature
            .map(|sig| Extension {
                tag: EXT_NODE_SIGNATURE,
                data: sig.to_vec(),
            })
            .into_iter()
            .collect();
        Ok(Step::Send(envelope::encode(&AuthProof { proof }, &exts)?))
    }

    fn on_reply(&mut self, env: &Envelope<'_>) -> Result<Step<Accepted>, WireError> {
        let reply: HelloReply = env.decode()?;
        match reply {
            HelloReply::Accept {
                version,
                node,
                incarnation,
                features,
            } => {
                if self.auth.is_enabled() {
                    self.check_server_proof(env)?;
                }
                let verified = self.check_server_identity(node.as_ref(), env)?;
                let channel = self.channel(features, env.body)?;
                Ok(Step::Finish(
                    Vec::new(),
                    Ok(Accepted {
                        version,
                        node,
                        incarnation,
                        channel,
                        verified,
                    }),
                ))
            }
            HelloReply::Reject { reason } if reason.starts_with(SEAL_REASON_PREFIX) => {
                Err(WireError::Integrity(reason))
            }
            HelloReply::Reject { reason } if reason.starts_with(AUTH_REASON_PREFIX) => {
                Err(WireError::Unauthenticated(reason))
            }
            HelloReply::Reject { reason } if reason.starts_with(VERSION_REASON_PREFIX) => {
                Err(WireError::HandshakeVersion {
                    ours: HANDSHAKE_VERSION,
                    theirs: parse_version(&reason).unwrap_or(0),
                })
            }
            HelloReply::Reject { reason } => Err(WireError::Handshake(reason)),
        }
    }

    /// An acceptance in an authenticated cluster must carry the server's proof over the
    /// whole exchange, the acceptance itself included.
    /// The connection's keys when the server agreed to seal (its proof already checked).
    fn channel(
        &self,
        features: u64,
        accept_body: &[u8],
    ) -> Result<Option<crate::seal::ChannelKeys>, WireError> {
        let agreed = self.seal != 0 && features & crate::seal::FEATURE_SEAL != 0;
        if !agreed {
            if self.seal & crate::seal::FEATURE_SEAL_REQUIRED != 0 {
                return Err(WireError::Integrity(
                    "encryption in transit is required here and the server did not agree to \
                     seal (a release before sealing)"
                        .into(),
                ));
            }
            return Ok(None);
        }
        let Some(server_nonce) = self.server_nonce else {
            return Err(WireError::Unauthenticated(
                "the server agreed to seal without proving the cluster secret".into(),
            ));
        };
        Ok(self.auth.channel_keys(
            0,
            &self.nonce,
            &server_nonce,
            &[&self.hello_frame, accept_body],
        ))
    }

    /// Whether the server proved the node id it names (its proof of the secret already
    /// checked); an error when it presented a certificate that does not hold, or presented
    /// none where this side requires it.
    fn check_server_identity(
        &self,
        node: Option<&crate::NodeId>,
        env: &Envelope<'_>,
    ) -> Result<bool, WireError> {
        let (Some(id), Some(node), Some(ns)) = (self.auth.identity(), node, self.server_nonce)
        else {
            return Ok(false);
        };
        match (
            env.extension(EXT_NODE_CERT)?,
            env.extension(EXT_NODE_SIGNATURE)?,
        ) {
            (Some(cert), Some(sig)) => {
                let msg = super::identity_message(
                    b"server",
                    &self.nonce,
                    &ns,
                    &[&self.hello_frame, env.body],
                );
                id.check(node, cert, &msg, sig)?;
                Ok(true)
            }
            _ if id.requires() => Err(WireError::Unauthenticated(format!(
                "the server names node {node} without proving it with a node certificate, \
                 and this cluster requires node certificates"
            ))),
            _ => Ok(false),
        }
    }

    fn check_server_proof(&self, env: &Envelope<'_>) -> Result<(), WireError> {
        let Some(server_nonce) = self.server_nonce else {
            return Err(WireError::Unauthenticated(
                "the server accepted without proving the cluster secret (it runs with no \
                 cluster_secret)"
                    .into(),
            ));
        };
        let proof = match env.extension(EXT_SERVER_PROOF)? {
            Some(p) if p.len() == TAG_LEN => {
                let mut a = [0; TAG_LEN];
                a.copy_from_slice(p);
                a
            }
            _ => {
                return Err(WireError::Unauthenticated(
                    "the server accepted without its proof of the cluster secret".into(),
                ));
            }
        };
        if !self.auth.verify(
            Side::Server,
            &self.nonce,
            &server_nonce,
            &[&self.hello_frame, env.body],
            &proof,
        ) {
            return Err(WireError::Unauthenticated(
                "the server could not prove the cluster secret".into(),
            ));
        }
        Ok(())
    }
}

/// The server's version from a version reject reason (see [`super::version_reason`]).
fn parse_version(reason: &str) -> Option<u8> {
    let (_, rest) = reason.split_once(super::SERVER_RUNS)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}
