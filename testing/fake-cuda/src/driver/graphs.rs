//! Graph memory nodes and the device's graph memory pool, as the CUDA driver API and the
//! programming guide ("Graph Memory Nodes") document them:
//!
//! * `cuGraphAddMemAllocNode` assigns the allocation's virtual address (returned in
//!   `nodeParams.dptr`, fixed for the node's lifetime) and takes **no** physical memory;
//! * physical memory is mapped when the executable graph is uploaded (`cuGraphUpload`, or
//!   `cuGraphInstantiateWithParams` with `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`) or launched,
//!   not at instantiation (the stream is not known then); it comes from the device's graph
//!   pool, which grows by what it lacks (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`); a device
//!   without the room fails the launch with `CUDA_ERROR_OUT_OF_MEMORY`;
//! * an allocation not freed in its graph stays live after the launch
//!   (`CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`) until `cuMemFree(Async)` of its address, a free
//!   node of another graph, or the next launch of a graph instantiated with
//!   `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`; launching a graph again while its
//!   allocations are live (without that flag) is `CUDA_ERROR_INVALID_VALUE`;
//! * freed graph memory stays in the pool (reserved) until `cuDeviceGraphMemTrim`; destroying
//!   a graph or an executable graph frees nothing.
//!
//! Simplification: the pool never reuses one allocation's pages for another of the same
//! launch (a launch needs the sum of its allocations).

use std::collections::HashMap;

use super::graph_mem::*;
use super::Inner;
use crate::ffi::*;

impl Inner {
    /// `cuGraphCreate`: an empty graph.
    pub fn graph_create(&mut self, flags: u32) -> R<u64> {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = self.handle(0x6a);
        self.clock_graph_created(h);
        self.gmem.graphs.insert(h, Vec::new());
        Ok(h)
    }

    /// A graph a capture ended as (its captured work is one kernel-like node for the fake).
    pub fn graph_captured(&mut self, g: u64) {
        let n = self.handle(0x6c);
        self.gmem.nodes.insert(n, (g, Node::Other(NODE_KERNEL)));
        self.gmem.graphs.insert(g, vec![n]);
    }

    fn graph_nodes_mut(&mut self, g: u64) -> R<&mut Vec<u64>> {
        self.gmem.graphs.get_mut(&g).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    fn check_deps(&self, g: u64, deps: &[u64]) -> R<()> {
        for d in deps {
            match self.gmem.nodes.get(d) {
                Some((owner, _)) if *owner == g => {}
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
        }
        Ok(())
    }

    /// `cuGraphAddMemAllocNode` (and `cuGraphAddNode` with `CU_GRAPH_NODE_TYPE_MEM_ALLOC`):
    /// the allocation's address, no physical memory.
    pub fn graph_add_alloc(
        &mut self,
        g: u64,
        deps: &[u64],
        alloc_type: u32,
        loc: CUmemLocation,
        size: u64,
    ) -> R<(u64, u64)> {
        self.graph_nodes_mut(g)?;
        self.check_deps(g, deps)?;
        if size == 0
            || alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED
            || loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let phys = self.phys_of(loc.id)?;
        let dptr = self.shared().next_address(phys, size);
        let n = self.handle(0x6c);
        let node = Node::Alloc {
            ordinal: loc.id as usize,
            size,
            dptr,
        };
        self.gmem.nodes.insert(n, (g, node));
        self.graph_nodes_mut(g)?.push(n);
        Ok((n, dptr))
    }

    /// `cuGraphAddMemFreeNode`: `dptr` must be an allocation node's address not already freed
    /// in this graph (`CUDA_ERROR_INVALID_VALUE` otherwise, as documented).
    pub fn graph_add_free(&mut self, g: u64, deps: &[u64], dptr: u64) -> R<u64> {
        self.graph_nodes_mut(g)?;
        self.check_deps(g, deps)?;
        let is_alloc = self
            .gmem
            .nodes
            .values()
            .any(|(_, n)| matches!(n, Node::Alloc { dptr: d, .. } if *d == dptr));
        let freed_here = self.gmem.graphs[&g].iter().any(
            |h| matches!(self.gmem.nodes.get(h), Some((_, Node::Free { dptr: d })) if *d == dptr),
        );
        if !is_alloc || freed_here {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let n = self.handle(0x6c);
        self.gmem.nodes.insert(n, (g, Node::Free { dptr }));
        self.graph_nodes_mut(g)?.push(n);
        Ok(n)
    }

    /// `cuGraphAddEmptyNode`.
    pub fn graph_add_empty(&mut self, g: u64, deps: &[u64]) -> R<u64> {
        self.graph_nodes_mut(g)?;
        self.check_deps(g, deps)?;
        let n = self.handle(0x6c);
        self.gmem.nodes.insert(n, (g, Node::Other(NODE_EMPTY)));
        self.graph_nodes_mut(g)?.push(n);
        Ok(n)
    }

    /// The nodes of graph `g` (`cuGraphGetNodes`).
    pub fn graph_get_nodes(&self, g: u64) -> R<Vec<u64>> {
        self.gmem
            .graphs
            .get(&g)
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// A node (`cuGraphNodeGetType`, `cuGraphMemAllocNodeGetParams`, ...).
    pub fn graph_node(&self, n: u64) -> R<Node> {
        self.gmem
            .nodes
            .get(&n)
            .map(|(_, node)| *node)
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// The memory nodes of graph `g`, for an executable graph.
    fn exec_mem_of(&self, g: u64, flags: u64) -> R<ExecMem> {
        let nodes = self.graph_get_nodes(g)?;
        let mut m = ExecMem {
            auto_free: flags & FLAG_AUTO_FREE_ON_LAUNCH != 0,
            ..ExecMem::default()
        };
        for n in nodes {
            match self.graph_node(n)? {
                Node::Alloc {
                    ordinal,
                    size,
                    dptr,
                } => m.allocs.push((ordinal, size, dptr)),
                Node::Free { dptr } => m.frees.push(dptr),
                Node::Other(_) => {}
            }
        }
        Ok(m)
    }

    /// `cuGraphInstantiate*` of graph `g`: records the executable graph's memory nodes (no
    /// memory is taken here).
    pub fn graph_exec_created(&mut self, x: u64, g: u64, flags: u64) -> R<()> {
        let m = self.exec_mem_of(g, flags)?;
        self.gmem.execs.insert(x, m);
        Ok(())
    }

    /// `cuGraphExecUpdate`: the executable graph takes `g`'s node parameters; the topology
    /// (node count and types) must be the same, else `Err(())`.
    pub fn graph_exec_update(&mut self, x: u64, g: u64) -> R<Result<(), ()>> {
        let old = self.gmem.execs.get(&x).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let (auto_free, uploaded) = (old.auto_free, old.uploaded);
        let new = self.exec_mem_of(g, 0)?;
        let old = &self.gmem.execs[&x];
        if old.allocs.len() != new.allocs.len() || old.frees.len() != new.frees.len() {
            return Ok(Err(()));
        }
        self.gmem.execs.insert(
            x,
            ExecMem {
                auto_free,
                uploaded,
                ..new
            },
        );
        Ok(Ok(()))
    }

    fn gpool(&mut self, ordinal: usize) -> &mut GraphPool {
        self.gmem.pools.entry(ordinal).or_default()
    }

    /// Grows ordinal's graph pool so that `need` bytes beyond its live allocations fit.
    fn gpool_reserve(&mut self, ordinal: usize, need: u64) -> R<()> {
        let p = *self.gpool(ordinal);
        let want = p.used.saturating_add(need);
        if want > p.reserved {
            let phys = self.visible[ordinal];
            self.charge(phys, want - p.reserved)?;
            let p = self.gpool(ordinal);
            p.reserved = want;
            p.reserved_high = p.reserved_high.max(want);
        }
        Ok(())
    }

    /// Maps what executable graph `x` needs (`cuGraphUpload`, and the start of a launch).
    pub fn graph_upload(&mut self, x: u64) -> R<()> {
        let m = self
            .gmem
            .execs
            .get(&x)
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut per: HashMap<usize, u64> = HashMap::new();
        for &(o, size, dptr) in &m.allocs {
            // An allocation of this graph still live from its last launch is freed by an
            // auto-free launch first: its memory is available to this one.
            if m.auto_free && self.gmem.live.contains_key(&dptr) {
                continue;
            }
            *per.entry(o).or_default() += size;
        }
        for (o, need) in per {
            self.gpool_reserve(o, need)?;
        }
        if let Some(e) = self.gmem.execs.get_mut(&x) {
            e.uploaded = true;
        }
        Ok(())
    }

    /// `cuGraphLaunch`: the graph's allocations become live (those freed in the graph are
    /// released again at its end). Fails before anything runs: `CUDA_ERROR_INVALID_VALUE`
    /// when an allocation of the graph is still live (without auto-free),
    /// `CUDA_ERROR_OUT_OF_MEMORY` when the pool cannot grow.
    pub fn graph_launch_mem(&mut self, x: u64) -> R<()> {
        let m = self
            .gmem
            .execs
            .get(&x)
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if m.allocs.is_empty() {
            return Ok(());
        }
        for &(_, _, dptr) in &m.allocs {
            if self.gmem.live.contains_key(&dptr) && !m.auto_free {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        self.graph_upload(x)?;
        for &(_, _, dptr) in &m.allocs {
            self.graph_free_live(dptr);
        }
        for &(o, size, dptr) in &m.allocs {
            self.gmem.live.insert(dptr, (o, size));
            let p = self.gpool(o);
            p.used += size;
            p.used_high = p.used_high.max(p.used);
        }
        for dptr in &m.frees {
            self.graph_free_live(*dptr);
        }
        Ok(())
    }

    /// Frees a live graph allocation (its memory stays in the pool). Whether it was one.
    pub fn graph_free_live(&mut self, dptr: u64) -> bool {
        match self.gmem.live.remove(&dptr) {
            Some((o, size)) => {
                let p = self.gpool(o);
                p.used = p.used.saturating_sub(size);
                true
            }
            None => false,
        }
    }

    /// `cuDeviceGraphMemTrim`: the pool gives back what no live allocation uses.
    pub fn graph_mem_trim(&mut self, ordinal: CUdevice) -> R<()> {
        let phys = self.phys_of(ordinal)?;
        let p = *self.gpool(ordinal as usize);
        if p.reserved > p.used {
            self.uncharge(phys, p.reserved - p.used);
            self.gpool(ordinal as usize).reserved = p.used;
        }
        Ok(())
    }

    /// `cuDeviceGetGraphMemAttribute` (0 used, 1 used high, 2 reserved, 3 reserved high).
    pub fn graph_mem_attr(&mut self, ordinal: CUdevice, attr: i32) -> R<u64> {
        self.phys_of(ordinal)?;
        let p = *self.gpool(ordinal as usize);
        match attr {
            0 => Ok(p.used),
            1 => Ok(p.used_high),
            2 => Ok(p.reserved),
            3 => Ok(p.reserved_high),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuDeviceSetGraphMemAttribute`: only the high watermarks, only reset to 0.
    pub fn graph_mem_set_attr(&mut self, ordinal: CUdevice, attr: i32, v: u64) -> R<()> {
        self.phys_of(ordinal)?;
        if v != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = self.gpool(ordinal as usize);
        match attr {
            1 => p.used_high = 0,
            3 => p.reserved_high = 0,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }

    /// `cuGraphExecDestroy`: the executable graph's memory nodes go; live allocations and the
    /// pool stay.
    pub fn graph_exec_forget(&mut self, x: u64) {
        self.gmem.execs.remove(&x);
    }

    /// `cuGraphDestroy`: its nodes go (live allocations stay).
    pub fn graph_forget(&mut self, g: u64) {
        if let Some(nodes) = self.gmem.graphs.remove(&g) {
            for n in nodes {
                self.gmem.nodes.remove(&n);
            }
        }
    }
}
