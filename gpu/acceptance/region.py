"""The shared region file's bytes (hami-common/src/layout.rs, versions 1 and 2), read directly
as a cross-check of `hami-agent inspect`: limits, used, slots.

Pure functions of bytes; gpu/test_acceptance.py pins the offsets against layout.rs.
"""

import struct

# Usage kinds of every slot per layout version (version 2 added "pool" and "other").
REGION_MAGIC = b"HAMIRSv\x01"
REGION_HEADER_SIZE = 968
REGION_MAX_DEVICES = 16
REGION_MAX_SLOTS = 1024
REGION_USAGE_KINDS = {1: ("context", "module", "data"),
                      2: ("context", "module", "data", "pool", "other")}
_OFF_LIMITS = 136
_OFF_USED = 584


def region_slot_size(version):
    """Bytes of one slot: pid, status, start time, then [device][kind] u64 counters."""
    return 16 + REGION_MAX_DEVICES * len(REGION_USAGE_KINDS[version]) * 8


def read_region_bytes(data):
    """Decode a v1/v2 region file: {"limits", "used", "slots": [{"pid", "status", "usage"}]}."""
    if len(data) < REGION_HEADER_SIZE or data[:8] != REGION_MAGIC:
        raise ValueError("not a region (magic)")
    version, header_size, total_size = struct.unpack_from("<IIQ", data, 8)
    if version not in REGION_USAGE_KINDS or header_size != REGION_HEADER_SIZE:
        raise ValueError(f"region version {version} header {header_size}: layout changed")
    if len(data) < total_size:
        raise ValueError("region truncated")
    kinds = REGION_USAGE_KINDS[version]
    slot_size = region_slot_size(version)
    limits = list(struct.unpack_from("<16Q", data, _OFF_LIMITS))
    used = list(struct.unpack_from("<16Q", data, _OFF_USED))
    slots = []
    nslots = min(REGION_MAX_SLOTS, (total_size - header_size) // slot_size)
    for i in range(nslots):
        off = header_size + i * slot_size
        pid, status, _start = struct.unpack_from("<IIQ", data, off)
        if status == 0 and pid == 0:
            continue
        usage = struct.unpack_from(f"<{REGION_MAX_DEVICES * len(kinds)}Q", data, off + 16)
        dev0 = dict(zip(kinds, usage[:len(kinds)]))
        slots.append({"slot": i, "pid": pid, "status": status, "usage": dev0,
                      "total": sum(usage)})
    return {"limits": limits, "used": used, "slots": slots}

