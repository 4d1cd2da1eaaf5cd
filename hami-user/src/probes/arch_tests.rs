//! The embedded eBPF object reads uprobe arguments and return values where this
//! architecture's `struct pt_regs` keeps them.
//!
//! aya-ebpf picks the `pt_regs` layout by the `bpf_target_arch` cfg, which aya-build sets
//! from the agent's own target (`CARGO_CFG_TARGET_ARCH`): an aarch64 agent must carry
//! programs that read `regs[0..]` (offsets 0, 8, ...), an x86-64 one `rdi`, `rsi`, `rax`
//! (offsets 112, 104, 80). This test decodes the programs' instructions and collects the
//! offsets of the loads from the context register, so a cross build that embedded the
//! host's object (or a program reading x86 registers by name) fails here, under qemu, even
//! though no arm64 kernel is at hand to load it.

use std::collections::BTreeSet;

use object::{Object, ObjectSection, ObjectSymbol};

use super::attach::EBPF_OBJECT;

/// `BPF_LDX | BPF_MEM | size` opcodes (bytes, half, word, double word).
const LDX_MEM: [u8; 4] = [0x71, 0x69, 0x61, 0x79];
/// `BPF_ALU64 | BPF_MOV | BPF_X`: `dst = src`.
const MOV64_REG: u8 = 0xbf;
/// `BPF_JMP | BPF_CALL`: clobbers r1-r5.
const CALL: u8 = 0x85;

/// `(argument registers' offsets, return register's offset)` in this architecture's
/// `struct pt_regs`.
fn expected() -> (Vec<i16>, i16) {
    if cfg!(target_arch = "aarch64") {
        // struct user_pt_regs { u64 regs[31]; sp; pc; pstate; }: x0.. at 0, 8, ...
        (vec![0, 8, 16, 24, 32, 40, 48, 56], 0)
    } else if cfg!(target_arch = "x86_64") {
        // rdi, rsi, rdx, rcx, r8, r9; rax.
        (vec![112, 104, 96, 88, 72, 64], 80)
    } else {
        panic!("no pt_regs layout written down for this architecture")
    }
}

/// Offsets of the loads made from the context pointer (r1 at entry, and the registers it
/// is copied to until a call clobbers them) by the program `name`.
fn ctx_load_offsets(name: &str) -> BTreeSet<i16> {
    let file = object::File::parse(EBPF_OBJECT).expect("the embedded eBPF object parses");
    assert_eq!(
        file.architecture(),
        object::Architecture::Bpf,
        "not a BPF object"
    );
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("program {name} missing from the object"));
    let section = file
        .section_by_index(sym.section_index().expect("program in a section"))
        .expect("program section");
    let data = section.data().expect("section data");
    let start = sym.address() as usize;
    let end = start + sym.size() as usize;
    assert!(end <= data.len() && sym.size() > 0, "program {name} bounds");
    let mut ctx_regs: BTreeSet<u8> = [1].into();
    let mut offsets = BTreeSet::new();
    for insn in data[start..end].chunks_exact(8) {
        let (op, dst, src) = (insn[0], insn[1] & 0x0f, insn[1] >> 4);
        let off = i16::from_le_bytes([insn[2], insn[3]]);
        if LDX_MEM.contains(&op) && ctx_regs.contains(&src) {
            offsets.insert(off);
        }
        if op == MOV64_REG {
            if ctx_regs.contains(&src) {
                ctx_regs.insert(dst);
            } else {
                ctx_regs.remove(&dst);
            }
        } else if op == CALL {
            ctx_regs.retain(|r| *r > 5);
        } else if LDX_MEM.contains(&op) || op & 0x07 == 0x04 || op & 0x07 == 0x07 {
            // A load or an ALU operation writes dst: it no longer holds the context.
            ctx_regs.remove(&dst);
        }
    }
    offsets
}

#[test]
fn uprobes_read_arguments_from_this_architectures_pt_regs() {
    let (args, _) = expected();
    // cuMemAlloc_v2(CUdeviceptr*, size_t): the first two argument registers.
    assert_eq!(
        ctx_load_offsets("cuMemAlloc_v2"),
        BTreeSet::from([args[0], args[1]])
    );
    // cuCtxCreate_v3(CUcontext*, params, int, unsigned, CUdevice): arguments 0 and 4.
    assert_eq!(
        ctx_load_offsets("cuCtxCreate_v3"),
        BTreeSet::from([args[0], args[4]])
    );
    // cuMemFree_v2(CUdeviceptr): the first.
    assert_eq!(ctx_load_offsets("cuMemFree_v2"), BTreeSet::from([args[0]]));
}

#[test]
fn uretprobes_read_the_result_from_this_architectures_return_register() {
    let (_, ret) = expected();
    for name in [
        "cuMemAlloc_v2_ret",
        "cuMemFree_v2_ret",
        "cuCtxCreate_v2_ret",
    ] {
        assert_eq!(ctx_load_offsets(name), BTreeSet::from([ret]), "{name}");
    }
}
