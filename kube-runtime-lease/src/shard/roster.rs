//! The roster: one Lease per member (`<base>-member-<hash of identity>`),
//! whose holder is the member while it takes part. It is written when a
//! member joins, leaves or is evicted, and never renewed, so that a watch of
//! the roster costs nothing between changes: a member's liveness shows in
//! the renewals of its shards, watched by the members that would take them.
//! An entry left free (its member left or was evicted) is deleted once it has
//! been seen unchanged for a lease duration ([`delete`]): each process has
//! its own identity, so every start adds an entry.

use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube_client::{
    Api,
    api::{DeleteParams, PostParams, Preconditions},
};

use crate::LeaseConfig;

/// What one write to the roster did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Wrote {
    /// The entry says what was asked.
    Done,
    /// The entry changed since it was read (a conflict): left as it is.
    Changed,
}

/// Makes `config.identity` the holder of its entry `config.name` (creating
/// it), as `config` describes it: its labels (the shard count among them)
/// and annotations.
pub(super) async fn join(api: &Api<Lease>, config: &LeaseConfig) -> Result<(), kube_client::Error> {
    let pp = PostParams::default();
    // A conflict means another write came between the read and ours (a
    // peer's eviction, or this identity's previous process): read again.
    for _ in 0..3 {
        let now = crate::record::now();
        let seconds = config.lease_duration_seconds();
        match api.get_opt(&config.name).await? {
            None => {
                let mut lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(config.name.clone()),
                        namespace: Some(config.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(crate::record::taken(None, &config.identity, seconds, 0, now)),
                };
                config.extras.metadata.apply(&mut lease.metadata);
                match api.create(&pp, &lease).await {
                    Err(e) if is_conflict(&e) => {}
                    other => return other.map(drop),
                }
            }
            Some(mut lease) => {
                let spec = lease.spec.clone().unwrap_or_default();
                if crate::record::holder(&spec) == Some(config.identity.as_str()) {
                    // Held already (this identity's previous process): its
                    // labels brought up to date, so that a new shard count
                    // (a StatefulSet's pod restarted by a rolling update) is
                    // read from it; the record is left as it is.
                    let mut metadata = lease.metadata.clone();
                    config.extras.metadata.apply(&mut metadata);
                    if metadata == lease.metadata {
                        return Ok(());
                    }
                    lease.metadata = metadata;
                    match api.replace(&config.name, &pp, &lease).await {
                        Err(e) if is_conflict(&e) => continue,
                        other => return other.map(drop),
                    }
                }
                let transitions = spec.lease_transitions.unwrap_or(0).saturating_add(1);
                lease.spec = Some(crate::record::taken(
                    Some(&spec),
                    &config.identity,
                    seconds,
                    transitions,
                    now,
                ));
                config.extras.metadata.apply(&mut lease.metadata);
                match api.replace(&config.name, &pp, &lease).await {
                    Err(e) if is_conflict(&e) => {}
                    other => return other.map(drop),
                }
            }
        }
    }
    Ok(())
}

/// Clears the holder of the entry `seen` (as last read: the write is
/// refused if it changed since), so that its member no longer counts: when
/// a member leaves, or a peer evicts it.
pub(super) async fn clear(api: &Api<Lease>, seen: &Lease) -> Result<Wrote, kube_client::Error> {
    Ok(clear_to(api, seen).await?.map_or(Wrote::Changed, |_| Wrote::Done))
}

/// [`clear`], with the entry as written (`None`: it changed since `seen`).
pub(super) async fn clear_to(api: &Api<Lease>, seen: &Lease) -> Result<Option<Lease>, kube_client::Error> {
    let Some(name) = seen.metadata.name.as_deref() else {
        return Ok(None);
    };
    let mut lease = seen.clone();
    let spec = lease.spec.clone().unwrap_or_default();
    lease.spec = Some(crate::record::released(&spec, crate::record::now()));
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(written) => Ok(Some(written)),
        Err(e) if is_conflict(&e) || is_not_found(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Deletes the entry `seen` (a departed member's, free), only if it is still
/// that record: the delete's preconditions are the uid and resourceVersion
/// judged, so that an entry its member wrote again since (it joined again)
/// is left alone.
pub(super) async fn delete(api: &Api<Lease>, seen: &Lease) -> Result<Wrote, kube_client::Error> {
    let Some(name) = seen.metadata.name.as_deref() else {
        return Ok(Wrote::Changed);
    };
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: seen.metadata.resource_version.clone(),
            uid: seen.metadata.uid.clone(),
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(Wrote::Done),
        Err(e) if is_conflict(&e) || is_not_found(&e) => Ok(Wrote::Changed),
        Err(e) => Err(e),
    }
}

fn is_conflict(e: &kube_client::Error) -> bool {
    matches!(e, kube_client::Error::Api(s) if s.code == 409)
}

fn is_not_found(e: &kube_client::Error) -> bool {
    matches!(e, kube_client::Error::Api(s) if s.code == 404)
}
