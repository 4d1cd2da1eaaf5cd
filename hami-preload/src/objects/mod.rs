//! Over [`crate::ledger`]: the driver's objects the process keeps track of, each charged
//! through the ledger. [`context`] (contexts), [`green`] (green contexts), [`module_memory`]
//! (module and library memory) with the [`images`] they load, [`pool_reservations`] (what
//! stream-ordered pools hold reserved), [`graph_memory`] (graph memory nodes), [`vmm`]
//! (`cuMemCreate` handles), [`lmem`] (context limits and local memory).

pub mod context;
pub mod graph_memory;
pub mod green;
pub mod images;
pub mod lmem;
pub mod module_memory;
pub mod pool_reservations;
pub mod vmm;
