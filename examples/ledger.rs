//! Fenced writes: how a term's work writes to a Kubernetes object so that no
//! write from an older term lands after a newer term's (see the crate docs'
//! "Fencing" section, and `examples/fenced_write.rs`).
//!
//! The object here is a `ConfigMap` used as a ledger: each write appends one
//! line `<n> <token> <entry>` (`n` counts the writes, `token` is the writing
//! term's fencing token) to its `ledger` key, keeping the last [`KEEP`] lines,
//! and records the token in its `token` key. The pattern, which carries over
//! to any object, is three steps:
//!
//! 1. **read** the object;
//! 2. **check** that the term still holds ([`LeaseGuard::is_valid`]) *after*
//!    the read, and that the object's token is not newer than this term's;
//! 3. **write** with the resourceVersion that was read as a precondition
//!    (`replace` carries it), and the term's token in the object.
//!
//! A newer term that has written the object has moved both its token and its
//! resourceVersion on, so an older term's write either read it (and sees the
//! newer token: [`Appended::Fenced`]) or read before it (and its
//! precondition fails: [`Appended::Conflict`]).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use kube_runtime_lease::LeaseGuard;

/// How many lines the ledger keeps.
pub const KEEP: usize = 100;

/// What [`append`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Appended {
    /// The line was written as the `n`-th write.
    Written {
        /// Its number.
        n: u64,
    },
    /// The term had ended when the object was read: nothing written.
    TermEnded,
    /// The object carries a newer term's token: nothing written.
    Fenced {
        /// That token.
        newer: i64,
    },
    /// Someone wrote the object between the read and the write (HTTP 409):
    /// nothing written; read again to retry.
    Conflict,
}

impl Appended {
    /// A one-word name (the candidate's `LEDGER` lines).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Written { .. } => "written",
            Self::TermEnded => "term-ended",
            Self::Fenced { .. } => "fenced",
            Self::Conflict => "conflict",
        }
    }
}

/// Appends `entry` to the ledger `ConfigMap` `name`, fenced by `guard`'s
/// term (see the [module docs](self)).
///
/// # Errors
/// When the read or the write fails other than by a conflict.
pub async fn append(
    api: &Api<ConfigMap>,
    name: &str,
    guard: &LeaseGuard,
    entry: &str,
) -> Result<Appended, kube::Error> {
    let mut cm = api.get(name).await?;
    // After the read: a term that ended before it must not act on what it read.
    if !guard.is_valid() {
        return Ok(Appended::TermEnded);
    }
    let token = guard.fencing_token();
    let data = cm.data.get_or_insert_default();
    if let Some(newer) = data
        .get("token")
        .and_then(|t| t.parse::<i64>().ok())
        .filter(|stored| *stored > token)
    {
        return Ok(Appended::Fenced { newer });
    }
    // Saturating: a count edited to `u64::MAX` is no panic.
    let n = data
        .get("count")
        .and_then(|c| c.parse::<u64>().ok())
        .unwrap_or(0)
        .saturating_add(1);
    let old = data.remove("ledger").unwrap_or_default();
    let mut lines: Vec<&str> = old.lines().collect();
    let line = format!("{n} {token} {entry}");
    lines.push(&line);
    let ledger = lines[lines.len().saturating_sub(KEEP)..].join("\n");
    data.insert("ledger".to_owned(), ledger);
    data.insert("count".to_owned(), n.to_string());
    data.insert("token".to_owned(), token.to_string());
    // `cm` still carries the resourceVersion read: the write's precondition.
    match api.replace(name, &PostParams::default(), &cm).await {
        Ok(_) => Ok(Appended::Written { n }),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(Appended::Conflict),
        Err(e) => Err(e),
    }
}
