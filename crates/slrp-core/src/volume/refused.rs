//! CreateVolume answers slrp refuses, and how each one is settled.
//!
//! When the CSI client refuses a CreateVolume answer (an id slrp cannot store, a volume
//! larger than `limit_bytes`, a context over the bound: `slrp_csi::answer`), the plugin
//! has already created the volume. Keeping the CreateVolume intent would re-send the call
//! at every start and after every deletion of what it made, and the plugin would
//! re-create the volume each time. So the intent is replaced, in one commit, by a
//! [`RefusedCreate`] record under the same name, and the volume the plugin named is
//! deleted by the id it gave (when it gave one that can be sent back):
//!
//! ```text
//! intent ──CreateVolume, answer refused──▶ RefusedCreate{Deleting(id)} ──DeleteVolume──▶ RefusedCreate{Deleted(id)}
//!                                     └──▶ RefusedCreate{Orphaned} (no usable id: nothing to delete by)
//! ```
//!
//! The record stays (a tombstone): a later create of the name fails at once with
//! [`VolumeError::CreateRefused`] and sends nothing, so the name is never created again,
//! whoever asks. A deletion that fails stays `Deleting` (with its error) and is tried
//! again like an unsettled intent: in the background with backoff, and at every start.
//! Operators see the records in `slrp ctl volumes` (state `CREATE_REFUSED`).

use std::fmt;

use serde::{Deserialize, Serialize};
use slrp_csi::answer::shown;
use slrp_csi::{CsiRpc, CsiVolumes, Secrets, Violation, VolumeId};
use slrp_store::{Kind, Record};
use slrp_types::DisplayChain;

use super::driver::is_already_done;
use super::error::{Subject, VolumeError};
use super::handle::CreateVolume;
use super::jobs::Ctx;
use super::manager::{failpoints, injected};
use super::paths::PathError;

/// What became of the volume behind a refused CreateVolume answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum RefusedCleanup {
    /// DeleteVolume of `volume_id` is owed (not sent yet, or it failed).
    Deleting {
        /// The id the plugin gave.
        volume_id: VolumeId,
        /// The last DeleteVolume failure, with its cause chain.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_error: Option<String>,
    },
    /// DeleteVolume of `volume_id` succeeded (or the plugin no longer had it).
    Deleted {
        /// The id the plugin gave.
        volume_id: VolumeId,
    },
    /// The answer named no volume slrp can send back (an empty id, or one too long to
    /// keep): whatever the plugin created is left to its operator.
    Orphaned,
}

impl RefusedCleanup {
    /// The volume's id, when there is one.
    pub fn volume_id(&self) -> Option<&VolumeId> {
        match self {
            Self::Deleting { volume_id, .. } | Self::Deleted { volume_id } => Some(volume_id),
            Self::Orphaned => None,
        }
    }

    /// Whether a DeleteVolume is still owed.
    pub fn is_pending(&self) -> bool {
        match self {
            Self::Deleting { .. } => true,
            Self::Deleted { .. } | Self::Orphaned => false,
        }
    }
}

impl fmt::Display for RefusedCleanup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Deleting {
                volume_id,
                last_error: None,
            } => write!(
                f,
                "the volume it created ('{}') is being deleted",
                shown(volume_id.as_str())
            ),
            Self::Deleting {
                volume_id,
                last_error: Some(e),
            } => write!(
                f,
                "deleting the volume it created ('{}') failed ({e}); retried in the background",
                shown(volume_id.as_str())
            ),
            Self::Deleted { volume_id } => write!(
                f,
                "the volume it created ('{}') was deleted",
                shown(volume_id.as_str())
            ),
            Self::Orphaned => f.write_str(
                "it named no volume slrp can delete by: whatever it created is left in the plugin",
            ),
        }
    }
}

/// A refused CreateVolume answer and what became of its volume (kind
/// `volume_create_refused`, key = the CreateVolume name); see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedCreate {
    /// The CreateVolume the answer was for.
    pub request: CreateVolume,
    /// The rule the answer broke (`slrp_csi::Violation::rule`).
    pub rule: String,
    /// What was wrong with it (`slrp_csi::Violation`'s text: never the offending value).
    pub reason: String,
    /// What became of the volume.
    pub cleanup: RefusedCleanup,
}

impl Record for RefusedCreate {
    const KIND: Kind = Kind::new("volume_create_refused");
    fn key(&self) -> String {
        self.request.name.clone()
    }
}

impl fmt::Display for RefusedCreate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CreateVolume answered what slrp refuses ({}); {}",
            self.reason, self.cleanup
        )
    }
}

/// Why an answer is refused: a rule of the CSI client's (`slrp_csi::Violation`), or the
/// volume manager's own (an id that cannot name a mount directory).
pub(super) struct Refusal {
    /// The rule's name.
    pub(super) rule: &'static str,
    /// What was wrong, never the offending value.
    pub(super) reason: String,
}

impl From<&Violation> for Refusal {
    fn from(v: &Violation) -> Self {
        Self {
            rule: v.rule(),
            reason: v.to_string(),
        }
    }
}

impl Refusal {
    /// An id the client accepted that still cannot be the volume's directory name.
    pub(super) fn of_path(e: &PathError) -> Self {
        let reason = match e {
            PathError::EmptyId => "volume_id is empty".to_owned(),
            PathError::TooLong { len, .. } => format!(
                "volume_id encodes to {len} bytes, more than a directory name may have (255)"
            ),
            PathError::BadEncoding { .. } | PathError::BadPluginName { .. } => e.to_string(),
        };
        Self {
            rule: "unusable_id",
            reason,
        }
    }
}

impl<C: CsiVolumes> Ctx<C> {
    /// The refused record of `name`, if its create was refused before.
    pub(super) async fn refused_record(
        &self,
        name: &str,
    ) -> Result<Option<RefusedCreate>, VolumeError> {
        self.store
            .get(name)
            .await
            .map_err(|source| VolumeError::Store {
                subject: Subject::Name(name.to_owned()),
                source,
            })
    }

    /// Settles a CreateVolume answer the client refused: the intent becomes a
    /// [`RefusedCreate`] (one commit), and the volume it named is deleted.
    ///
    /// Returns what the create fails with: [`VolumeError::CreateRefused`], or a store
    /// failure.
    pub(super) async fn refuse_create(
        &self,
        req: &CreateVolume,
        refusal: Refusal,
        created: Option<VolumeId>,
        retried: bool,
    ) -> VolumeError {
        let record = RefusedCreate {
            request: req.clone(),
            rule: refusal.rule.to_owned(),
            reason: refusal.reason,
            cleanup: match created {
                Some(volume_id) => RefusedCleanup::Deleting {
                    volume_id,
                    last_error: None,
                },
                None => RefusedCleanup::Orphaned,
            },
        };
        let store_err = |source| VolumeError::Store {
            subject: Subject::Name(req.name.clone()),
            source,
        };
        let mut tx = self.store.transaction();
        let staged = tx
            .put(&record)
            .and_then(|tx| tx.delete::<CreateVolume>(&req.name))
            .map(|_| ());
        if let Err(e) = staged {
            return store_err(e);
        }
        if let Err(e) = tx.commit().await {
            return store_err(e);
        }
        tracing::warn!(name = %req.name, rule = refusal.rule, reason = %record.reason, cleanup = %record.cleanup,
            "CreateVolume answer refused; the name is never created again");
        match self.settle_refused(record, retried).await {
            Ok(record) | Err((record, None)) => VolumeError::CreateRefused {
                name: req.name.clone(),
                refusal: Box::new(record),
            },
            Err((_, Some(fatal))) => fatal,
        }
    }

    /// Sends the DeleteVolume a `Deleting` record owes and records its outcome; other
    /// records are settled already. The record as it is now, or (with a fatal error) as
    /// it was.
    pub(super) async fn settle_refused(
        &self,
        mut record: RefusedCreate,
        retried: bool,
    ) -> Result<RefusedCreate, (RefusedCreate, Option<VolumeError>)> {
        let RefusedCleanup::Deleting { volume_id, .. } = &record.cleanup else {
            return Ok(record);
        };
        let volume_id = volume_id.clone();
        let policy = if retried {
            self.cfg.retry.policy(CsiRpc::DeleteVolume)
        } else {
            None
        };
        let no_secrets = Secrets::default();
        if let Err(e) = injected(failpoints::BEFORE_CALL) {
            return Err((record, Some(e)));
        }
        let deleted = self
            .call_with(CsiRpc::DeleteVolume, policy, || {
                self.csi.delete_volume(&volume_id, &no_secrets)
            })
            .await;
        if let Err(e) = injected(failpoints::AFTER_CALL) {
            return Err((record, Some(e)));
        }
        record.cleanup = match deleted {
            Ok(()) => RefusedCleanup::Deleted {
                volume_id: volume_id.clone(),
            },
            Err(e) if is_already_done(&e) => RefusedCleanup::Deleted {
                volume_id: volume_id.clone(),
            },
            Err(e) => RefusedCleanup::Deleting {
                volume_id: volume_id.clone(),
                last_error: Some(DisplayChain(&e).to_string()),
            },
        };
        let mut tx = self.store.transaction();
        let committed = match tx.put(&record) {
            Ok(_) => tx.commit().await,
            Err(e) => Err(e),
        };
        if let Err(source) = committed {
            let e = VolumeError::Store {
                subject: Subject::Name(record.request.name.clone()),
                source,
            };
            let fatal = e.is_fatal().then_some(e);
            return Err((record, fatal));
        }
        if record.cleanup.is_pending() {
            tracing::warn!(name = %record.request.name, volume = %shown(volume_id.as_str()), cleanup = %record.cleanup,
                "deleting the volume of a refused CreateVolume answer failed");
            Err((record, None))
        } else {
            tracing::info!(name = %record.request.name, volume = %shown(volume_id.as_str()),
                "deleted the volume of a refused CreateVolume answer");
            Ok(record)
        }
    }
}
