//! The polls waiting on this replica: one wake-up per Machine with an agent long-polling here, and one that
//! wakes them all (the store's change feed lagged or reconnected: every waiter looks again). The agents wing
//! wakes a Machine's polls when its record or run changes, in this replica or, through the feed, in another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use inplace_agent_api::MachineRef;
use tokio::sync::Notify;

/// The waiting polls of this replica.
#[derive(Default)]
pub struct Waiters {
    by_machine: Mutex<HashMap<MachineRef, Arc<Notify>>>,
    /// Every waiter is also woken by this.
    everyone: Notify,
}

impl Waiters {
    fn map(&self) -> MutexGuard<'_, HashMap<MachineRef, Arc<Notify>>> {
        self.by_machine
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How many Machines have an agent long-polling this replica right now.
    pub fn waiting(&self) -> usize {
        self.map().len()
    }

    /// The wake-up of `machine`'s polls, registered until [`Waiters::leave`].
    pub(super) fn join(&self, machine: &MachineRef) -> Arc<Notify> {
        self.map().entry(machine.clone()).or_default().clone()
    }

    /// The wake-up every waiter also listens to.
    pub(super) fn everyone(&self) -> &Notify {
        &self.everyone
    }

    /// Wakes the polls of `machine`'s agent on this replica.
    pub fn wake(&self, machine: &MachineRef) {
        let notify = self.map().get(machine).cloned();
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
    }

    /// Wakes every waiting poll (each looks again).
    pub fn wake_everyone(&self) {
        self.everyone.notify_waiters();
    }

    /// A poll of `machine` stops waiting; the last one to leave removes the Machine.
    pub(super) fn leave(&self, machine: &MachineRef, notify: Arc<Notify>) {
        let mut waiters = self.map();
        // Two references: the map's and ours. Anything more is another waiting poll.
        if Arc::strong_count(&notify) <= 2 {
            waiters.remove(machine);
        }
    }
}
