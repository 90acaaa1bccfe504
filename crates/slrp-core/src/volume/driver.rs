//! The driver loop of one transition: plan → begin → commit → RPC → finish → commit, and
//! the requests it builds.

use std::collections::BTreeMap;
use std::path::Path;

use slrp_csi::retry::{RetryPolicy, retry_observed};
use slrp_csi::{
    ControllerPublishRequest, CsiError, CsiRpc, CsiVolumes, NodePublishRequest, NodeStageRequest,
    RetryClass, Secrets, StringMap, VolumeId,
};
use slrp_types::DisplayChain;

use super::error::{PreparedDir, Subject, VolumeError};
use super::jobs::Ctx;
use super::manager::{TargetPath, failpoints, injected};
use super::state::{CsiCall, Goal, SecretRef, VolumeRecord};

/// A built request for one transition RPC (built before the intent is committed, so a
/// missing secret fails without changing anything).
pub(super) enum Request {
    ControllerPublish(ControllerPublishRequest),
    ControllerUnpublish,
    NodeStage(NodeStageRequest),
    NodeUnstage(String),
    NodePublish(NodePublishRequest),
    NodeUnpublish(String),
}

pub(super) fn path_str(id: &VolumeId, p: &Path) -> Result<String, VolumeError> {
    p.to_str()
        .map(str::to_owned)
        // The mount root is checked to be UTF-8 when the manager starts and encoded ids
        // are ASCII, so this only fails on a bug.
        .ok_or_else(|| VolumeError::Internal {
            subject: Subject::Volume(id.clone()),
            what: "its mount path is not UTF-8",
        })
}

pub(super) fn is_already_done(e: &CsiError) -> bool {
    e.retry_class() == RetryClass::AlreadyDone
}

impl<C: CsiVolumes> Ctx<C> {
    pub(super) async fn persist(&self, rec: &VolumeRecord) -> Result<(), VolumeError> {
        self.persist_with(rec, |_| Ok(())).await
    }

    /// Puts `rec` with `more` changes in one commit.
    pub(super) async fn persist_with(
        &self,
        rec: &VolumeRecord,
        more: impl FnOnce(&mut slrp_store::Transaction) -> Result<(), slrp_store::StoreError>,
    ) -> Result<(), VolumeError> {
        let store_err = |source| VolumeError::Store {
            subject: Subject::Volume(rec.id.clone()),
            source,
        };
        let mut tx = self.store.transaction();
        tx.put(rec).map_err(store_err)?;
        more(&mut tx).map_err(store_err)?;
        tx.commit().await.map_err(store_err)
    }

    /// Moves `rec` towards `goal`; `rec` always equals what is durable (or, after a
    /// fatal error, what may be).
    pub(super) async fn drive(
        &self,
        rec: &mut VolumeRecord,
        goal: Goal,
    ) -> Result<(), VolumeError> {
        let (caps, boot) = (&self.cfg.caps, &self.cfg.boot_id);
        // Each round settles one call; the chain has at most three calls in one
        // direction after finishing one undo, so this bound only stops a planning bug.
        for _ in 0..16 {
            let (planned, call) = rec.next_call(goal, caps, boot);
            let Some(call) = call else {
                if planned != *rec {
                    // Only in-memory no-ops led here: make them durable too, so that
                    // memory and disk never disagree.
                    self.persist(&planned).await?;
                    *rec = planned;
                }
                return Ok(());
            };
            let request = self.request(call, &planned)?;
            self.prepare(call, &planned.id).await?;
            let in_flight =
                planned
                    .begin(call, boot)
                    .map_err(|source| VolumeError::Transition {
                        id: planned.id.clone(),
                        state: planned.state.name(),
                        source,
                    })?;
            if in_flight != *rec {
                self.persist(&in_flight).await?;
                *rec = in_flight;
            }
            injected(failpoints::BEFORE_CALL)?;
            let result = self.send(&rec.id, request).await;
            injected(failpoints::AFTER_CALL)?;
            let publish_context = match result {
                Ok(pc) => pc,
                Err(e) if !call.is_forward() && is_already_done(&e) => StringMap::new(),
                Err(source) => {
                    tracing::warn!(volume = %rec.id, rpc = %call, error = %DisplayChain(&source),
                        "CSI call failed; the volume stays in flight");
                    if let Some(observer) = &self.cfg.observer {
                        let error = format!("{call}: {}", DisplayChain(&source));
                        observer.volume_call_failed(&rec.id, &error);
                    }
                    return Err(VolumeError::Csi {
                        rpc: call.rpc(),
                        subject: Subject::Volume(rec.id.clone()),
                        source,
                    });
                }
            };
            // Mesos's post-checks (v1/v0 `_publishVolume`, v1 `__unpublishVolume`): the
            // call "succeeded" but the path says otherwise, so the volume stays in flight
            // and the next request or recovery drives the call again.
            self.check_target(call, &rec.id).await?;
            let done =
                rec.finish(call, publish_context)
                    .map_err(|source| VolumeError::Transition {
                        id: rec.id.clone(),
                        state: rec.state.name(),
                        source,
                    })?;
            self.persist(&done).await?;
            tracing::debug!(volume = %done.id, state = %done.state.name(), "volume moved");
            if let Some(observer) = &self.cfg.observer {
                observer.volume_moved(&done.id);
            }
            *rec = done;
        }
        Err(VolumeError::Internal {
            subject: Subject::Volume(rec.id.clone()),
            what: "the plan did not reach its goal",
        })
    }

    pub(super) fn secrets(
        &self,
        id: &VolumeId,
        refs: &BTreeMap<String, SecretRef>,
    ) -> Result<Secrets, VolumeError> {
        let mut out = StringMap::new();
        for (csi_key, r) in refs {
            let value = self
                .cfg
                .secrets
                .resolve(r)
                .ok_or_else(|| VolumeError::Secret {
                    id: id.clone(),
                    name: r.name.clone(),
                    key: r.key.clone(),
                })?;
            out.insert(csi_key.clone(), value);
        }
        Ok(Secrets::new(out))
    }

    pub(super) fn request(
        &self,
        call: CsiCall,
        rec: &VolumeRecord,
    ) -> Result<Request, VolumeError> {
        let id = &rec.id;
        let spec = &rec.spec;
        let paths = &self.cfg.mount_paths;
        let path_err = |source| VolumeError::Path {
            id: id.clone(),
            source,
        };
        let publish_context = rec.state.publish_context().cloned().unwrap_or_default();
        Ok(match call {
            CsiCall::ControllerPublish => Request::ControllerPublish(ControllerPublishRequest {
                volume_id: id.clone(),
                node_id: self.cfg.node_id.clone(),
                capability: spec.capability.clone(),
                readonly: spec.readonly,
                volume_context: spec.volume_context.clone(),
                secrets: Secrets::default(),
            }),
            CsiCall::ControllerUnpublish => Request::ControllerUnpublish,
            CsiCall::NodeStage => Request::NodeStage(NodeStageRequest {
                volume_id: id.clone(),
                publish_context,
                staging_target_path: path_str(id, &paths.staging(id).map_err(path_err)?)?,
                capability: spec.capability.clone(),
                volume_context: spec.volume_context.clone(),
                secrets: self.secrets(id, &spec.node_stage_secrets)?,
            }),
            CsiCall::NodeUnstage => {
                Request::NodeUnstage(path_str(id, &paths.staging(id).map_err(path_err)?)?)
            }
            CsiCall::NodePublish => Request::NodePublish(NodePublishRequest {
                volume_id: id.clone(),
                publish_context,
                staging_target_path: if self.cfg.caps.node_stage() {
                    Some(path_str(id, &paths.staging(id).map_err(path_err)?)?)
                } else {
                    None
                },
                target_path: path_str(id, &paths.target(id).map_err(path_err)?)?,
                capability: spec.capability.clone(),
                readonly: spec.readonly,
                volume_context: spec.volume_context.clone(),
                secrets: self.secrets(id, &spec.node_publish_secrets)?,
            }),
            CsiCall::NodeUnpublish => {
                Request::NodeUnpublish(path_str(id, &paths.target(id).map_err(path_err)?)?)
            }
        })
    }

    /// Creates the directories a call needs (CSI: the CO creates the staging path and
    /// the target's parent).
    pub(super) async fn prepare(&self, call: CsiCall, id: &VolumeId) -> Result<(), VolumeError> {
        let paths = &self.cfg.mount_paths;
        let path_err = |source| VolumeError::Path {
            id: id.clone(),
            source,
        };
        // `named` is the path Mesos's message names (the target, also when only its
        // parent is created).
        let (kind, dir, named) = match call {
            CsiCall::NodeStage => {
                let staging = paths.staging(id).map_err(path_err)?;
                (PreparedDir::Staging, staging.clone(), staging)
            }
            CsiCall::NodePublish if self.cfg.target_path == TargetPath::CoCreates => {
                let target = paths.target(id).map_err(path_err)?;
                (PreparedDir::Target, target.clone(), target)
            }
            CsiCall::NodePublish => (
                PreparedDir::TargetParent,
                paths.volume_dir(id).map_err(path_err)?,
                paths.target(id).map_err(path_err)?,
            ),
            CsiCall::ControllerPublish
            | CsiCall::ControllerUnpublish
            | CsiCall::NodeUnstage
            | CsiCall::NodeUnpublish => return Ok(()),
        };
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|source| VolumeError::Prepare {
                dir: kind,
                path: named,
                source,
            })
    }

    /// After NodePublishVolume the target must exist; after NodeUnpublishVolume of a
    /// plugin that creates its targets it must be gone.
    async fn check_target(&self, call: CsiCall, id: &VolumeId) -> Result<(), VolumeError> {
        let expect_present = match call {
            CsiCall::NodePublish => true,
            CsiCall::NodeUnpublish if self.cfg.target_path == TargetPath::PluginCreates => false,
            CsiCall::NodeUnpublish
            | CsiCall::ControllerPublish
            | CsiCall::ControllerUnpublish
            | CsiCall::NodeStage
            | CsiCall::NodeUnstage => return Ok(()),
        };
        let path = self.target_path(id)?;
        // A dangling link at the target counts as present: something is there.
        let present = tokio::fs::symlink_metadata(&path).await.is_ok();
        match (expect_present, present) {
            (true, false) => Err(VolumeError::TargetNotCreated {
                id: id.clone(),
                path,
            }),
            (false, true) => Err(VolumeError::TargetNotRemoved {
                id: id.clone(),
                path,
            }),
            (true, true) | (false, false) => Ok(()),
        }
    }

    pub(super) async fn send(
        &self,
        id: &VolumeId,
        request: Request,
    ) -> Result<StringMap, CsiError> {
        let csi = &*self.csi;
        let node = &self.cfg.node_id;
        let none = |()| StringMap::new();
        match &request {
            Request::ControllerPublish(r) => {
                self.call(CsiRpc::ControllerPublishVolume, || {
                    csi.controller_publish(r)
                })
                .await
            }
            Request::ControllerUnpublish => self
                .call(CsiRpc::ControllerUnpublishVolume, || {
                    csi.controller_unpublish(id, node)
                })
                .await
                .map(none),
            Request::NodeStage(r) => self
                .call(CsiRpc::NodeStageVolume, || csi.node_stage(r))
                .await
                .map(none),
            Request::NodeUnstage(p) => self
                .call(CsiRpc::NodeUnstageVolume, || csi.node_unstage(id, p))
                .await
                .map(none),
            Request::NodePublish(r) => self
                .call(CsiRpc::NodePublishVolume, || csi.node_publish(r))
                .await
                .map(none),
            Request::NodeUnpublish(p) => self
                .call(CsiRpc::NodeUnpublishVolume, || csi.node_unpublish(id, p))
                .await
                .map(none),
        }
    }

    /// One CSI call under the manager's retry policy for `rpc`
    /// ([`VolumeManagerConfig::retry`](super::VolumeManagerConfig::retry)). Each attempt
    /// holds a concurrency permit; the backoff between attempts and the wait for a
    /// restarting plugin's endpoint before it ([`CsiVolumes::endpoint_ready`]) hold none,
    /// so calls waiting out an unavailable plugin never keep other volumes' calls from
    /// running.
    /// Shutdown ends a backoff at once with the last error (the volume stays in flight or
    /// its intent stays, as after any failed call).
    pub(super) async fn call<T, F, Fut>(&self, rpc: CsiRpc, attempt: F) -> Result<T, CsiError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, CsiError>>,
    {
        self.call_with(rpc, self.cfg.retry.policy(rpc), attempt)
            .await
    }

    /// [`Ctx::call`] under `policy` (`None`: one attempt), reported to the configured
    /// [`CallObserver`](super::CallObserver).
    pub(super) async fn call_with<T, F, Fut>(
        &self,
        rpc: CsiRpc,
        policy: Option<&RetryPolicy>,
        attempt: F,
    ) -> Result<T, CsiError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, CsiError>>,
    {
        let started = tokio::time::Instant::now();
        let result = self.retrying(rpc, policy, attempt, |_, _| {}).await;
        if let Some(observer) = &self.cfg.observer {
            observer.call_ended(rpc, started.elapsed(), result.is_ok());
        }
        result
    }

    /// [`Ctx::call_with`] for the CreateVolume of `name`: each retry is told to the
    /// observer ([`CallObserver::create_retrying`](super::CallObserver::create_retrying)),
    /// and so is the end, so operators see why a create is stuck and when it is tried
    /// next.
    pub(super) async fn create_call<T, F, Fut>(
        &self,
        name: &str,
        policy: Option<&RetryPolicy>,
        attempt: F,
    ) -> Result<T, CsiError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, CsiError>>,
    {
        let rpc = CsiRpc::CreateVolume;
        let started = tokio::time::Instant::now();
        let observer = self.cfg.observer.as_deref();
        let result = self
            .retrying(rpc, policy, attempt, |error, delay| {
                if let Some(o) = observer {
                    o.create_retrying(name, &DisplayChain(error).to_string(), delay);
                }
            })
            .await;
        if let Some(o) = observer {
            o.call_ended(rpc, started.elapsed(), result.is_ok());
            o.create_ended(name);
        }
        result
    }

    /// One attempt after another under `policy`, through the one retry loop
    /// ([`slrp_csi::retry_observed()`]; the client never retries, so a call is retried
    /// here only); `on_retry` hears each retried failure and the wait before the next.
    async fn retrying<T, F, Fut>(
        &self,
        rpc: CsiRpc,
        policy: Option<&RetryPolicy>,
        attempt: F,
        mut on_retry: impl FnMut(&CsiError, std::time::Duration),
    ) -> Result<T, CsiError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, CsiError>>,
    {
        let attempt = &attempt;
        retry_observed(
            rpc,
            policy,
            &self.cancel,
            || async move {
                // A plugin that is restarting is waited for before taking a permit: calls
                // waiting for one container's endpoint must not hold off the calls to
                // another (or to the same one once it is back). Not cut short by
                // shutdown: a job finishing within the shutdown grace still makes its
                // next calls, and the wait is bounded by one call deadline.
                self.csi.endpoint_ready(rpc).await?;
                // Never closed; if it were, calls would simply run unlimited.
                let _permit = self.permits.acquire().await.ok();
                attempt().await
            },
            |error, _, delay| on_retry(error, delay),
        )
        .await
    }
}
