//! The node's operating system as the agent reads and changes it: the root, state dir and command environment
//! every driver works with (`driver_env`), the node's facts and versions (`inventory`), reboot decisions
//! (`reboot`), systemd-sysext images (`sysext`), its user database (`users`), and the bootc stand-in the demo and
//! tests boot.

pub mod bootc_stand_in;
pub(crate) mod driver_env;
pub(crate) mod inventory;
pub(crate) mod reboot;
pub(crate) mod sysext;
pub(crate) mod users;
