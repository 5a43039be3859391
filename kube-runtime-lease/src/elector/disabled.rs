//! The election switched off ([`LeaseConfig::enabled`](crate::LeaseConfig::enabled)):
//! one term that begins at the first `acquire`, ends only at `shutdown`, and
//! never touches the API.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::info;

use super::Inner;
use crate::{error::AcquireError, guard::LeaseGuard, term::Term};

impl Inner {
    /// A guard of the one term of a disabled election, begun now if it has
    /// not begun yet.
    pub(super) fn lead_unelected(&self) -> Result<LeaseGuard, AcquireError> {
        let mut state = self.lock();
        if state.shutdown {
            return Err(AcquireError::Shutdown);
        }
        let begun = state.term.is_none();
        let timeless = || Arc::new(Term::timeless(0, Instant::now()));
        let term = state.term.get_or_insert_with(timeless).clone();
        drop(state);
        // The term ends only with `shutdown`, which is checked above.
        let guard = LeaseGuard::of(&term, self.wake.clone()).ok_or(AcquireError::Shutdown)?;
        if begun {
            self.update_status(|s| {
                s.is_leader = true;
                s.holder = Some(self.config.identity.clone());
            });
            self.observers.tell(super::Transition::Leading(true));
            info!("leader election disabled: leading without a lease (no API call is made)");
        }
        Ok(guard)
    }
}
