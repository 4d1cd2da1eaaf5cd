"""The shared region file's bytes (hami-abi/src/layout.rs, versions 1 to 4), read directly
as a cross-check of `hami-agent inspect`: limits, used, slots, and who holds the region lock.

Pure functions of bytes; gpu/test_acceptance.py pins the offsets against layout.rs.
"""

import struct

REGION_MAGIC = b"HAMIRSv\x01"
REGION_MAX_DEVICES = 16
REGION_MAX_SLOTS = 1024
# Usage kinds of every slot per layout version (version 2 added "pool" and "other").
REGION_USAGE_KINDS = {1: ("context", "module", "data"),
                      2: ("context", "module", "data", "pool", "other"),
                      3: ("context", "module", "data", "pool", "other"),
                      4: ("context", "module", "data", "pool", "other")}
# Header bytes per layout version (version 3 padded it to 1024).
# Version 4 kept the header and slots and appended 16 compute records of 64 bytes.
REGION_HEADER_SIZES = {1: 968, 2: 968, 3: 1024, 4: 1024}
# Enough of a file to hold the header of any known version.
REGION_HEADER_READ = max(REGION_HEADER_SIZES.values())
_OFF_LIMITS = 136
_OFF_USED = 584
# Version 3 slots: pid, status, start time, usage[device][kind], then charged[device] and
# reserve[device] (u64 each), padded to 1024 bytes.
_V3_SLOT_SIZE = 1024


def region_slot_size(version):
    """Bytes of one slot: pid, status, start time, then [device][kind] u64 counters (and, from
    version 3, charged[device], reserve[device] and padding)."""
    if version >= 3:
        return _V3_SLOT_SIZE
    return 16 + REGION_MAX_DEVICES * len(REGION_USAGE_KINDS[version]) * 8


def _version(data):
    """(version, header_size, total_size) of a region file's bytes of a known layout."""
    if len(data) < 16 or data[:8] != REGION_MAGIC:
        raise ValueError("not a region (magic)")
    version, header_size, total_size = struct.unpack_from("<IIQ", data, 8)
    if REGION_HEADER_SIZES.get(version) != header_size:
        raise ValueError(f"region version {version} header {header_size}: layout changed")
    if len(data) < header_size:
        raise ValueError("region truncated (header)")
    return version, header_size, total_size


def read_region_bytes(data):
    """Decode a v1/v2/v3 region file: {"version", "limits", "used" (per device; from v3 the
    admitted total, reserves included), "slots": [{"slot", "pid", "status", "usage" (device 0
    by kind), "total"; v3: "charged", "reserve" (device 0)}]}."""
    version, header_size, total_size = _version(data)
    if len(data) < total_size:
        raise ValueError("region truncated")
    kinds = REGION_USAGE_KINDS[version]
    slot_size = region_slot_size(version)
    limits = list(struct.unpack_from("<16Q", data, _OFF_LIMITS))
    used = list(struct.unpack_from("<16Q", data, _OFF_USED))
    slots = []
    tail = REGION_MAX_DEVICES * 64 if version >= 4 else 0
    nslots = min(REGION_MAX_SLOTS, (total_size - header_size - tail) // slot_size)
    nusage = REGION_MAX_DEVICES * len(kinds)
    for i in range(nslots):
        off = header_size + i * slot_size
        pid, status, _start = struct.unpack_from("<IIQ", data, off)
        if status == 0 and pid == 0:
            continue
        usage = struct.unpack_from(f"<{nusage}Q", data, off + 16)
        dev0 = dict(zip(kinds, usage[:len(kinds)]))
        s = {"slot": i, "pid": pid, "status": status, "usage": dev0, "total": sum(usage)}
        if version >= 3:
            charged_off = off + 16 + 8 * nusage
            s["charged"] = struct.unpack_from("<Q", data, charged_off)[0]
            s["reserve"] = struct.unpack_from("<Q", data, charged_off + 8 * REGION_MAX_DEVICES)[0]
        slots.append(s)
    return {"version": version, "limits": limits, "used": used, "slots": slots}


# The region lock, `RegionHeader::lock`: a process-shared, robust `pthread_mutex_t` after
# magic (8), version (4), header_size (4), total_size (8), init_state (4), device_count (4),
# creator_pid (4), _pad0 (4) and created_unix (8).
OFF_LOCK = 48
# glibc keeps a robust mutex's owner in its first 32-bit word (the futex word): the owner's
# thread id, with FUTEX_WAITERS and FUTEX_OWNER_DIED in the top two bits; 0 when free.
FUTEX_TID_MASK = 0x3FFFFFFF


def region_lock_owner(data):
    """Thread id of the region lock's holder according to the file's bytes (0: free).

    Raises ValueError for bytes that are not a region of a layout this module knows (the lock
    may sit elsewhere in another layout)."""
    _version(data)
    (word,) = struct.unpack_from("<I", data, OFF_LOCK)
    return word & FUTEX_TID_MASK
