//! `#[repr(C)]` structs of `cuda.h`, field for field (fields in snake case), with the layout
//! of 64-bit Linux pinned by the tests below.

use core::ffi::{c_int, c_uint, c_void};

use crate::types::{CUdeviceptr, CUgraphNode, CUstream};

/// `CUuuid` (`struct CUuuid_st { char bytes[16]; }`).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct CUuuid {
    /// `bytes`: the 16 bytes of the UUID.
    pub bytes: [u8; 16],
}

/// `CUmemLocation` (`CUmemLocation_v1`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    /// `type` (`CUmemLocationType`).
    pub type_: c_uint,
    /// `id`: the device ordinal for `CU_MEM_LOCATION_TYPE_DEVICE`.
    pub id: c_int,
}

/// `CUmemAllocationProp` (`CUmemAllocationProp_v1`), the properties `cuMemCreate` takes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    /// `type` (`CUmemAllocationType`).
    pub type_: c_uint,
    /// `requestedHandleTypes` (`CUmemAllocationHandleType`).
    pub requested_handle_types: c_uint,
    /// `location`: where the memory lives.
    pub location: CUmemLocation,
    /// `win32HandleMetaData` (Windows only).
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags` (`compressionType`, `gpuDirectRDMACapable`, `usage`, `reserved[4]`).
    pub alloc_flags: [u8; 8],
}

/// The leading fields of `CUmemPoolProps` (`cuMemPoolCreate`'s argument): the only ones read
/// from a caller's struct, whatever the CUDA version that laid out the rest.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolPropsHead {
    /// `allocType` (`CUmemAllocationType`).
    pub alloc_type: c_uint,
    /// `handleTypes` (`CUmemAllocationHandleType`).
    pub handle_types: c_uint,
    /// `location`: where the pool's memory lives.
    pub location: CUmemLocation,
}

/// `CUmemPoolProps` (`CUmemPoolProps_v1`), whole (88 bytes; this is the CUDA 12.2+ field list,
/// older headers have `reserved[64]` after `win32SecurityAttributes`: the same size).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    /// `allocType` (`CUmemAllocationType`).
    pub alloc_type: c_uint,
    /// `handleTypes` (`CUmemAllocationHandleType`).
    pub handle_types: c_uint,
    /// `location`: where the pool's memory lives.
    pub location: CUmemLocation,
    /// `win32SecurityAttributes` (Windows only).
    pub win32_security_attributes: *mut c_void,
    /// `maxSize` (0: a system-dependent default).
    pub max_size: usize,
    /// `usage` (bitmask).
    pub usage: u16,
    /// `reserved[54]`.
    pub reserved: [u8; 54],
}

/// `CUmemAccessDesc` (`CUmemAccessDesc_v1`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAccessDesc {
    /// `location`: the device the access is granted to.
    pub location: CUmemLocation,
    /// `flags` (`CUmemAccess_flags`).
    pub flags: c_uint,
}

/// `CUDA_ARRAY_DESCRIPTOR` (`CUDA_ARRAY_DESCRIPTOR_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    /// `Width` in elements.
    pub width: usize,
    /// `Height` in elements.
    pub height: usize,
    /// `Format` (`CUarray_format`).
    pub format: c_uint,
    /// `NumChannels` per element.
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`CUDA_ARRAY3D_DESCRIPTOR_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    /// `Width` in elements.
    pub width: usize,
    /// `Height` in elements.
    pub height: usize,
    /// `Depth` in elements (or layers, with `CUDA_ARRAY3D_LAYERED`).
    pub depth: usize,
    /// `Format` (`CUarray_format`).
    pub format: c_uint,
    /// `NumChannels` per element.
    pub num_channels: c_uint,
    /// `Flags` (`CUDA_ARRAY3D_*`).
    pub flags: c_uint,
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (`_v1` and `_v2` share the layout): a graph allocation node's
/// parameters.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    /// `poolProps`: where the allocation lives.
    pub pool_props: CUmemPoolProps,
    /// `accessDescs`.
    pub access_descs: *const CUmemAccessDesc,
    /// `accessDescCount`.
    pub access_desc_count: usize,
    /// `bytesize`.
    pub bytesize: usize,
    /// `dptr`: the address the driver assigns.
    pub dptr: CUdeviceptr,
}

/// `CUgraphNodeParams` (CUDA 12.2+): the node type, then a 232-byte union at offset 16
/// (`reserved1[29]`, or one of the node kinds' parameters, e.g. `CUDA_MEM_ALLOC_NODE_PARAMS_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUgraphNodeParams {
    /// `type` (`CUgraphNodeType`).
    pub type_: c_int,
    /// `reserved0[3]`.
    pub reserved0: [c_int; 3],
    /// The anonymous union, as its `long long reserved1[29]` member.
    pub union: [u64; 29],
    /// `reserved2`.
    pub reserved2: i64,
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS` (`cuGraphInstantiateWithParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_GRAPH_INSTANTIATE_PARAMS {
    /// `flags` (`CUgraphInstantiate_flags`).
    pub flags: u64,
    /// `hUploadStream`.
    pub h_upload_stream: CUstream,
    /// `hErrNode_out`.
    pub h_err_node_out: CUgraphNode,
    /// `result_out` (`CUgraphInstantiateResult`).
    pub result_out: c_int,
}

/// `CUgraphExecUpdateResultInfo` (`CUgraphExecUpdateResultInfo_v1`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUgraphExecUpdateResultInfo {
    /// `result` (`CUgraphExecUpdateResult`).
    pub result: c_int,
    /// `errorNode`.
    pub error_node: CUgraphNode,
    /// `errorFromNode`.
    pub error_from_node: CUgraphNode,
}

/// The leading fields of `CUlaunchConfig` (`cuLaunchKernelEx`), up to its stream: the only ones
/// read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchConfigHead {
    /// `gridDimX`, `gridDimY`, `gridDimZ`, `blockDimX`, `blockDimY`, `blockDimZ`,
    /// `sharedMemBytes`.
    pub dims: [c_uint; 7],
    /// `hStream`.
    pub stream: CUstream,
}

#[cfg(test)]
mod tests {
    //! Sizes, alignments and field offsets as gcc gives them for CUDA 12.6.3's `cuda.h` on
    //! x86_64 Linux (`sizeof`, `_Alignof`, `offsetof`); aarch64 Linux has the same LP64
    //! layout.

    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn cuuuid() {
        assert_eq!((size_of::<CUuuid>(), align_of::<CUuuid>()), (16, 1));
        assert_eq!(offset_of!(CUuuid, bytes), 0);
    }

    #[test]
    fn cumemlocation() {
        assert_eq!(
            (size_of::<CUmemLocation>(), align_of::<CUmemLocation>()),
            (8, 4)
        );
        assert_eq!(offset_of!(CUmemLocation, type_), 0);
        assert_eq!(offset_of!(CUmemLocation, id), 4);
    }

    #[test]
    fn cumemallocationprop() {
        assert_eq!(
            (
                size_of::<CUmemAllocationProp>(),
                align_of::<CUmemAllocationProp>()
            ),
            (32, 8)
        );
        assert_eq!(offset_of!(CUmemAllocationProp, type_), 0);
        assert_eq!(offset_of!(CUmemAllocationProp, requested_handle_types), 4);
        assert_eq!(offset_of!(CUmemAllocationProp, location), 8);
        assert_eq!(offset_of!(CUmemAllocationProp, win32_handle_meta_data), 16);
        assert_eq!(offset_of!(CUmemAllocationProp, alloc_flags), 24);
    }

    #[test]
    fn cumempoolprops() {
        assert_eq!(
            (size_of::<CUmemPoolProps>(), align_of::<CUmemPoolProps>()),
            (88, 8)
        );
        assert_eq!(offset_of!(CUmemPoolProps, alloc_type), 0);
        assert_eq!(offset_of!(CUmemPoolProps, handle_types), 4);
        assert_eq!(offset_of!(CUmemPoolProps, location), 8);
        assert_eq!(offset_of!(CUmemPoolProps, win32_security_attributes), 16);
        assert_eq!(offset_of!(CUmemPoolProps, max_size), 24);
        assert_eq!(offset_of!(CUmemPoolProps, usage), 32);
        assert_eq!(offset_of!(CUmemPoolProps, reserved), 34);
        // The head is a prefix of the whole.
        assert_eq!(offset_of!(CUmemPoolPropsHead, alloc_type), 0);
        assert_eq!(offset_of!(CUmemPoolPropsHead, handle_types), 4);
        assert_eq!(offset_of!(CUmemPoolPropsHead, location), 8);
        assert_eq!(size_of::<CUmemPoolPropsHead>(), 16);
        assert!(align_of::<CUmemPoolPropsHead>() <= align_of::<CUmemPoolProps>());
    }

    #[test]
    fn cumemaccessdesc() {
        assert_eq!(
            (size_of::<CUmemAccessDesc>(), align_of::<CUmemAccessDesc>()),
            (12, 4)
        );
        assert_eq!(offset_of!(CUmemAccessDesc, location), 0);
        assert_eq!(offset_of!(CUmemAccessDesc, flags), 8);
    }

    #[test]
    fn array_descriptors() {
        assert_eq!(
            (
                size_of::<CUDA_ARRAY_DESCRIPTOR>(),
                align_of::<CUDA_ARRAY_DESCRIPTOR>()
            ),
            (24, 8)
        );
        assert_eq!(offset_of!(CUDA_ARRAY_DESCRIPTOR, width), 0);
        assert_eq!(offset_of!(CUDA_ARRAY_DESCRIPTOR, height), 8);
        assert_eq!(offset_of!(CUDA_ARRAY_DESCRIPTOR, format), 16);
        assert_eq!(offset_of!(CUDA_ARRAY_DESCRIPTOR, num_channels), 20);
        assert_eq!(
            (
                size_of::<CUDA_ARRAY3D_DESCRIPTOR>(),
                align_of::<CUDA_ARRAY3D_DESCRIPTOR>()
            ),
            (40, 8)
        );
        assert_eq!(offset_of!(CUDA_ARRAY3D_DESCRIPTOR, width), 0);
        assert_eq!(offset_of!(CUDA_ARRAY3D_DESCRIPTOR, height), 8);
        assert_eq!(offset_of!(CUDA_ARRAY3D_DESCRIPTOR, depth), 16);
        assert_eq!(offset_of!(CUDA_ARRAY3D_DESCRIPTOR, format), 24);
        assert_eq!(offset_of!(CUDA_ARRAY3D_DESCRIPTOR, num_channels), 28);
        assert_eq!(offset_of!(CUDA_ARRAY3D_DESCRIPTOR, flags), 32);
    }

    #[test]
    fn mem_alloc_node_params() {
        assert_eq!(
            (
                size_of::<CUDA_MEM_ALLOC_NODE_PARAMS>(),
                align_of::<CUDA_MEM_ALLOC_NODE_PARAMS>()
            ),
            (120, 8)
        );
        assert_eq!(offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, pool_props), 0);
        assert_eq!(offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, access_descs), 88);
        assert_eq!(
            offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, access_desc_count),
            96
        );
        assert_eq!(offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize), 104);
        assert_eq!(offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, dptr), 112);
    }

    #[test]
    fn graph_node_params() {
        assert_eq!(
            (
                size_of::<CUgraphNodeParams>(),
                align_of::<CUgraphNodeParams>()
            ),
            (256, 8)
        );
        assert_eq!(offset_of!(CUgraphNodeParams, type_), 0);
        assert_eq!(offset_of!(CUgraphNodeParams, reserved0), 4);
        assert_eq!(offset_of!(CUgraphNodeParams, union), 16);
        assert_eq!(offset_of!(CUgraphNodeParams, reserved2), 248);
        // The union holds an allocation node's parameters.
        assert!(size_of::<CUDA_MEM_ALLOC_NODE_PARAMS>() <= size_of::<[u64; 29]>());
    }

    #[test]
    fn graph_instantiate_params() {
        assert_eq!(
            (
                size_of::<CUDA_GRAPH_INSTANTIATE_PARAMS>(),
                align_of::<CUDA_GRAPH_INSTANTIATE_PARAMS>()
            ),
            (32, 8)
        );
        assert_eq!(offset_of!(CUDA_GRAPH_INSTANTIATE_PARAMS, flags), 0);
        assert_eq!(
            offset_of!(CUDA_GRAPH_INSTANTIATE_PARAMS, h_upload_stream),
            8
        );
        assert_eq!(
            offset_of!(CUDA_GRAPH_INSTANTIATE_PARAMS, h_err_node_out),
            16
        );
        assert_eq!(offset_of!(CUDA_GRAPH_INSTANTIATE_PARAMS, result_out), 24);
    }

    #[test]
    fn graph_exec_update_result_info() {
        assert_eq!(
            (
                size_of::<CUgraphExecUpdateResultInfo>(),
                align_of::<CUgraphExecUpdateResultInfo>()
            ),
            (24, 8)
        );
        assert_eq!(offset_of!(CUgraphExecUpdateResultInfo, result), 0);
        assert_eq!(offset_of!(CUgraphExecUpdateResultInfo, error_node), 8);
        assert_eq!(offset_of!(CUgraphExecUpdateResultInfo, error_from_node), 16);
    }

    #[test]
    fn launch_config_head() {
        // `CUlaunchConfig`: 56 bytes, `sharedMemBytes` at 24, `hStream` at 32.
        assert_eq!(offset_of!(CUlaunchConfigHead, dims), 0);
        assert_eq!(
            offset_of!(CUlaunchConfigHead, dims) + 6 * size_of::<c_uint>(),
            24
        );
        assert_eq!(offset_of!(CUlaunchConfigHead, stream), 32);
        assert_eq!(align_of::<CUlaunchConfigHead>(), 8);
        assert!(size_of::<CUlaunchConfigHead>() <= 56);
    }
}
