//! The redacted base a TalosCluster publishes for the webhook's dry render (issue 37, ADR
//! 0106 §1): the controller reads the base Secret (`spec.baseConfigSecretRef`: the keys
//! `controlplane.yaml` and `worker.yaml`), parses it, replaces every secret value by a
//! placeholder (`render::Base::redacted`) and writes the result, with the real base's
//! digest, to `status.redactedBase`. The webhook never reads the Secret. Nothing of the
//! base's secrets reaches a log, an Event, a condition or the status: errors name the key
//! and a line, never what was there.

use crate::runtime::objects::{RedactedBase, TalosCluster};
use crate::runtime::render::{Base, CONTROLPLANE_KEY, WORKER_KEY};
use crate::runtime::secrets;

/// What becomes of `status.redactedBase`.
#[derive(Debug, PartialEq)]
pub enum Publish {
    /// The base, redacted, read now.
    Set(RedactedBase),
    /// No base to render against (no `baseConfigSecretRef`; its Secret missing, incomplete
    /// or invalid): what was published goes, so the webhook's dry render does not judge
    /// patches against a base the controller no longer renders from (every render fails
    /// now, and a machine that fails without the patch does not block it).
    Clear,
    /// The Secret could not be read (the API server failed to answer): what was published
    /// is the last base known, and stays until a read says otherwise.
    Keep,
}

/// What the controller found: what to publish, and the `BaseConfig` condition (status,
/// reason, message), `None` without a base Secret (the condition goes).
pub struct Published {
    pub redacted: Publish,
    pub condition: Option<(bool, &'static str, String)>,
}

/// Reads and redacts the base of `c`.
pub async fn publish(client: &kube::Client, c: &TalosCluster) -> Published {
    let Some(r) = &c.spec.base_config_secret_ref else {
        return Published {
            redacted: Publish::Clear,
            condition: None,
        };
    };
    let ns = c.namespace();
    let failed = |reason: &'static str, message: String| Published {
        redacted: Publish::Clear,
        condition: Some((false, reason, message)),
    };
    let raw = match secrets::get(client, ns, &r.name).await {
        Ok(Some(raw)) => raw,
        Ok(None) => {
            return failed(
                "BaseSecretMissing",
                format!(
                    "the base Secret {ns}/{} does not exist; create it with the keys {CONTROLPLANE_KEY} and {WORKER_KEY} as `talosctl gen config` writes them",
                    r.name
                ),
            );
        }
        Err(e) => {
            return Published {
                redacted: Publish::Keep,
                condition: Some((
                    false,
                    "BaseSecretUnreadable",
                    format!(
                        "the base Secret {ns}/{} could not be read: {e}; status.redactedBase keeps the last base read",
                        r.name
                    ),
                )),
            };
        }
    };
    let (Some(cp), Some(w)) = (raw.text(CONTROLPLANE_KEY), raw.text(WORKER_KEY)) else {
        return failed(
            "BaseSecretIncomplete",
            format!(
                "the base Secret {ns}/{} lacks {CONTROLPLANE_KEY} or {WORKER_KEY} (both are needed, as UTF-8 text)",
                r.name
            ),
        );
    };
    let base = match Base::parse(&cp, &w, true) {
        Ok(b) => b,
        // The error names the key and the line only (`secret`: no content).
        Err(e) => {
            return failed(
                "BaseInvalid",
                format!("the base Secret {ns}/{} does not read: {e}", r.name),
            );
        }
    };
    let redacted = base.redacted();
    match redacted.texts() {
        Ok((controlplane, worker)) => Published {
            condition: Some((
                true,
                "Published",
                format!(
                    "the base {} is published redacted in status.redactedBase for the webhook's dry render",
                    &base.digest[..12.min(base.digest.len())]
                ),
            )),
            redacted: Publish::Set(RedactedBase {
                digest: base.digest,
                controlplane,
                worker,
            }),
        },
        Err(e) => failed(
            "BaseInvalid",
            format!("the base could not be written redacted: {e}"),
        ),
    }
}
