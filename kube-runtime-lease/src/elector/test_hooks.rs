//! Tests: actions run when an election task reaches a [`Point`], for the
//! schedules a test cannot reach through the public API in bounded, paused
//! time (a race between two statements with no `.await` between them, a storm
//! of wake-ups). Kept here, out of the elector's types: the production code
//! only names the points it passes ([`reached`]), and an elector with no
//! hook registered runs as it would without them.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::{Inner, LeaderElector};
use crate::term::Term;

/// Points of an election task (or of `shutdown`) between two statements with
/// no `.await`, where on a multi-threaded runtime another thread may act (a
/// waiter registering, a shutdown beginning, a Controller polled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Point {
    /// A task was spawned, its handle not stored yet.
    Spawned,
    /// A task that nobody wanted any more is about to end.
    Exiting,
    /// The task re-counts who wants leadership: it is between two waits.
    Recount,
    /// `shutdown` began (no new guard), its signal to controllers
    /// (`shutdown_requested`) not sent yet.
    ShutdownBegun,
}

type Action = Box<dyn FnMut() + Send>;

struct Hook {
    /// The elector's shared state: a weak reference, so that its address is
    /// not reused while the hook is registered.
    inner: Weak<Inner>,
    point: Point,
    /// Run at every pass (a storm), or once.
    every_time: bool,
    action: Action,
}

static HOOKS: Mutex<Vec<Hook>> = Mutex::new(Vec::new());

/// Runs `action` when the election of `inner` next reaches `point` (every
/// time, with `every_time`).
pub(crate) fn add(inner: &Arc<Inner>, point: Point, every_time: bool, action: Action) {
    HOOKS.lock().push(Hook {
        inner: Arc::downgrade(inner),
        point,
        every_time,
        action,
    });
}

/// Removes the hooks registered at `point` for `inner`.
pub(crate) fn remove(inner: &Arc<Inner>, point: Point) {
    let inner = Arc::as_ptr(inner);
    HOOKS
        .lock()
        .retain(|h| !(h.point == point && std::ptr::eq(h.inner.as_ptr(), inner)));
}

/// The election of `inner` reached `point`: runs what is registered there,
/// with no lock held (an action may take the elector's).
pub(crate) fn reached(inner: &Inner, point: Point) {
    let matches = |h: &Hook| h.point == point && std::ptr::eq(h.inner.as_ptr(), inner);
    let mut taken = {
        let mut hooks = HOOKS.lock();
        // Electors dropped since: their hooks go.
        hooks.retain(|h| h.inner.strong_count() > 0);
        let Some(i) = hooks.iter().position(matches) else {
            return;
        };
        hooks.remove(i)
    };
    (taken.action)();
    if taken.every_time {
        HOOKS.lock().push(taken);
    }
}

/// Test hooks: each sets up or observes a schedule that the tests cannot
/// reach through the public API in bounded, paused time.
impl LeaderElector {
    /// Puts a hand-made term in force, with no task to renew or end it: the
    /// guards' and guarded streams' own clocks are then all that ends it.
    pub(crate) fn set_term_for_test(&self, term: Arc<Term>) {
        self.inner.lock().term = Some(term);
    }

    /// Runs `action` once, the next time the election task reaches `point`:
    /// a race between two statements with no `.await` between them, which a
    /// test cannot otherwise schedule.
    pub(crate) fn interleave_for_test(&self, point: Point, action: impl FnOnce() + Send + 'static) {
        let mut action = Some(action);
        let once = move || {
            if let Some(action) = action.take() {
                action();
            }
        };
        add(&self.inner, point, false, Box::new(once));
    }

    /// Whether an election task runs, and whether a task's handle is kept:
    /// the supervision's state, which no public method shows.
    pub(crate) fn tasks_for_test(&self) -> (bool, bool) {
        let state = self.inner.lock();
        (state.running, state.task.is_some())
    }

    /// Aborts the election task: it is dropped at its next poll, as when its
    /// runtime shuts down.
    pub(crate) fn abort_task_for_test(&self) {
        if let Some(task) = &self.inner.lock().task {
            task.abort();
        }
    }

    /// Whether a wake-up comes between any two waits of the election task
    /// (a storm of wake-ups, the worst that guards and acquisitions created
    /// and dropped without pause can do).
    pub(crate) fn set_storm_for_test(&self, storm: bool) {
        if storm {
            let wake = self.inner.wake.clone();
            let wake_up = move || wake.notify_one();
            add(&self.inner, Point::Recount, true, Box::new(wake_up));
        } else {
            remove(&self.inner, Point::Recount);
        }
    }
}
