//! What the graph calls (`graphs.rs`) keep: the node types and instantiate flags the fake
//! distinguishes, each graph's nodes, executable graphs' memory nodes and the graph pools
//! ([`GraphMem`]).

use std::collections::HashMap;

/// `CU_GRAPH_NODE_TYPE_*` the fake distinguishes.
pub const NODE_KERNEL: i32 = 0;
/// `CU_GRAPH_NODE_TYPE_EMPTY`.
pub const NODE_EMPTY: i32 = 5;
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`.
pub const NODE_MEM_ALLOC: i32 = 10;
/// `CU_GRAPH_NODE_TYPE_MEM_FREE`.
pub const NODE_MEM_FREE: i32 = 11;

/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
pub const FLAG_AUTO_FREE_ON_LAUNCH: u64 = 1;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` (only valid for `cuGraphInstantiateWithParams`).
pub const FLAG_UPLOAD: u64 = 2;

/// One node of a graph.
#[derive(Clone, Copy, Debug)]
pub enum Node {
    /// A node without memory (captured work, an empty node).
    Other(i32),
    /// An allocation node: CUDA ordinal, bytes, address.
    Alloc {
        ordinal: usize,
        size: u64,
        dptr: u64,
    },
    /// A free node of `dptr`.
    Free { dptr: u64 },
}

/// An executable graph's memory nodes.
#[derive(Clone, Debug, Default)]
pub struct ExecMem {
    /// (ordinal, size, dptr) of each allocation node.
    pub(super) allocs: Vec<(usize, u64, u64)>,
    /// Addresses freed in the graph.
    pub(super) frees: Vec<u64>,
    pub(super) auto_free: bool,
    /// The ordinals it has mapped memory for (uploaded or launched).
    pub(super) uploaded: bool,
}

/// The graph pool of one device.
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphPool {
    /// Bytes taken from the device.
    pub reserved: u64,
    /// Bytes of live graph allocations.
    pub used: u64,
    /// High watermarks.
    pub reserved_high: u64,
    /// See `reserved_high`.
    pub used_high: u64,
}

/// Process-local graph memory state.
#[derive(Default, Debug)]
pub struct GraphMem {
    /// Graph -> its nodes (handles, in order).
    pub(super) graphs: HashMap<u64, Vec<u64>>,
    /// Node handle -> (graph, node).
    pub(super) nodes: HashMap<u64, (u64, Node)>,
    /// Executable graph -> its memory nodes.
    pub(super) execs: HashMap<u64, ExecMem>,
    /// Graph pools by CUDA ordinal.
    pub(super) pools: HashMap<usize, GraphPool>,
    /// Live graph allocations: address -> (ordinal, bytes).
    pub(super) live: HashMap<u64, (usize, u64)>,
}
