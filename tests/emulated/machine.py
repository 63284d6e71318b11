"""Run one function of a static x86-64 ELF in the Bochs CPU emulator (bochscpu), without an OS.

The ELF is the freestanding harness tests/emulated/avx512_harness.c. Its loadable segments
are mapped at their addresses, plus a stack and a data window the caller fills and reads
back. The function is entered in 64-bit user mode with AVX-512 state enabled (CR4.OSXSAVE,
XCR0 = x87 | SSE | AVX | opmask | ZMM); it returns to an `hlt`, whose fault in user mode
ends the run. Any other exception ends it too, and is reported.
Run as a script by tests/test_avx512_emulated.py:
`machine.py HARNESS.elf JOBS.pkl OUT.pkl ENTRY_ADDRESS_HEX`."""

from __future__ import annotations

import pickle
import struct
import sys

import bochscpu
import bochscpu.cpu
import bochscpu.memory

PAGE = 4096
STACK_TOP = 0x7000_0000
STACK_BYTES = 64 * PAGE
DATA = 0x4000_0000          # the caller's window: job struct, inputs, outputs
GP_FAULT = 13               # what `hlt` raises in user mode: the end of a call
CR4_OSFXSR, CR4_OSXMMEXCPT, CR4_OSXSAVE = 1 << 9, 1 << 10, 1 << 18
XCR0_AVX512 = 0xE7          # x87, SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM


def load_segments(elf: bytes) -> list[tuple[int, int, bytes]]:
    """(virtual address, memory size, file bytes) of each PT_LOAD segment."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not a 64-bit ELF")
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    out = []
    for i in range(phnum):
        p_type, _, offset, vaddr, _, filesz, memsz, _ = struct.unpack_from(
            "<IIQQQQQQ", elf, phoff + i * phentsize)
        if p_type == 1:
            out.append((vaddr, memsz, elf[offset:offset + filesz]))
    return out


class Machine:
    """One emulated CPU with a hand-built page table (identity of nothing: every page is
    a fresh host page mapped where the ELF or the caller wants it)."""

    def __init__(self, elf: bytes, data_bytes: int) -> None:
        self.session = bochscpu.Session()
        self.session.missing_page_handler = self._missing_page
        self.table = bochscpu.memory.PageMapLevel4Table()
        self.next_gpa = 0x1_0000_0000
        self.cr3 = 0x10_0000
        self.halt = None
        for vaddr, memsz, _ in load_segments(elf):
            self._map(vaddr, memsz)
        self._map(DATA, data_bytes)
        self._map(STACK_TOP - STACK_BYTES, STACK_BYTES + PAGE)  # last page: the hlt
        for hva, gpa in self.table.commit(self.cr3):
            bochscpu.memory.page_insert(gpa, hva)
        for vaddr, _, data in load_segments(elf):
            self.write(vaddr, data)
        self.halt = STACK_TOP
        self.write(self.halt, b"\xf4")

    @staticmethod
    def _missing_page(gpa: int) -> None:
        raise RuntimeError(f"emulated code touched unmapped physical page {gpa:#x}")

    def _map(self, vaddr: int, size: int) -> None:
        for va in range(vaddr & ~(PAGE - 1), vaddr + size, PAGE):
            hva = bochscpu.memory.allocate_host_page()
            bochscpu.memory.page_insert(self.next_gpa, hva)
            self.table.insert(va, self.next_gpa, 1)  # 1: read-write (and executable)
            self.next_gpa += PAGE

    def write(self, vaddr: int, data: bytes) -> None:
        if data and not bochscpu.memory.virt_write(self.cr3, vaddr, list(data)):
            raise RuntimeError(f"cannot write {len(data)} bytes at {vaddr:#x}")

    def read(self, vaddr: int, size: int) -> bytes:
        return bytes(bochscpu.memory.virt_read(self.cr3, vaddr, size))

    def call(self, entry: int, *args: int) -> None:
        """Run entry(*args) (System V ABI, integer arguments) until it returns."""
        state = bochscpu.State()
        bochscpu.cpu.set_long_mode(state)
        state.cr3 = self.cr3
        state.cr4 = state.cr4 | CR4_OSFXSR | CR4_OSXMMEXCPT | CR4_OSXSAVE
        state.xcr0 = XCR0_AVX512
        state.mxcsr = 0x1F80  # round to nearest, all exceptions masked: the C default
        rsp = STACK_TOP - 72  # as after a call: rsp + 8 is 16-byte aligned
        self.write(rsp, struct.pack("<Q", self.halt))  # the return address
        state.rsp = rsp
        state.rip = entry
        if len(args) > 6:
            raise ValueError("only register arguments are supported")
        for reg, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9")[:len(args)], args,
                              strict=True):
            setattr(state, reg, value)
        code = bochscpu.Segment()
        code.present, code.selector, code.base, code.limit, code.attr = (
            True, 0x33, 0, 0xFFFF_FFFF, 0x22FB)  # 64-bit user code
        data = bochscpu.Segment()
        data.present, data.selector, data.base, data.limit, data.attr = (
            True, 0x2B, 0, 0xFFFF_FFFF, 0xCF3)
        state.cs = code
        state.ds = state.ss = state.es = state.fs = state.gs = data
        self.session.cpu.state = state
        stop: dict[str, int] = {}

        def on_exception(session, cpu_id, vector, error_code):
            stop.setdefault("vector", int(vector))
            stop.setdefault("rip", session.cpu.state.rip)
            session.stop()

        hook = bochscpu.Hook()
        hook.exception = on_exception
        self.session.run([hook])
        rip = stop.get("rip", -1)
        if stop.get("vector") != GP_FAULT or rip not in (self.halt, self.halt + 1):
            raise RuntimeError(f"emulated call stopped by exception {stop.get('vector')} "
                               f"at {rip:#x}, not at its return")


JOB = struct.Struct("<10q4Q9q")  # emu_job in avx512_harness.c


def run_jobs(elf: bytes, entry: int, jobs: list[dict]) -> list[bytes]:
    """Each job: op, fmt, m, n, k, lda, ldb, ldc, accumulate, threads, a, b, c (bytes),
    c_size, and b_offset (B's distance from a 64-byte boundary); for a scaled format also
    s (the kernels' scales, bytes), s_ld, s_bk, s_finite, s_half (s is a float16 grid),
    s_lsl (nm_scales.lsl: 0, or s is a packed layout's group-major grid) and s_per_super
    (> 0: s is a factored grid, nm_scales.c8, of super-blocks this many blocks long); and
    nibble_decode and gemv_streams (nm_set_nibble_decode's and nm_set_gemv_streams's values
    for the job; -1, the row's own, by default).
    Returns each job's c window
    (c_size bytes) after the call."""
    data_bytes = max(JOB.size + len(j["a"]) + len(j["b"]) + j["c_size"] + len(j.get("s", b""))
                     + 5 * 64 for j in jobs)
    machine = Machine(elf, data_bytes)
    results = []
    for j in jobs:
        a_at = DATA + (JOB.size + 63) // 64 * 64
        b_at = a_at + (len(j["a"]) + 63) // 64 * 64
        b_at += j.get("b_offset", 0)
        c_at = (b_at + len(j["b"]) + 63) // 64 * 64
        s_bytes = j.get("s", b"")
        s_at = (c_at + j["c_size"] + 63) // 64 * 64 if s_bytes else 0
        machine.write(a_at, j["a"])
        machine.write(b_at, j["b"])
        machine.write(c_at, j["c"])
        if s_bytes:
            machine.write(s_at, s_bytes)
        fields = [j[f] for f in ("op", "fmt", "m", "n", "k", "lda", "ldb", "ldc",
                                 "accumulate", "threads")]
        settings = [j.get(f, 0) for f in ("s_ld", "s_bk", "s_finite", "s_half", "s_lsl",
                                          "s_per_super")] + [j.get("nibble_decode", -1),
                                                            j.get("gemv_streams", -1)]
        machine.write(DATA, JOB.pack(*fields, a_at, b_at, c_at, s_at, *settings, -999))
        machine.call(entry, DATA)
        status = JOB.unpack(machine.read(DATA, JOB.size))[-1]
        if status not in (0, 1):
            raise RuntimeError(f"job {fields} returned status {status}")
        results.append(machine.read(c_at, j["c_size"]))
    return results


if __name__ == "__main__":
    elf_path, jobs_path, out_path, entry_hex = sys.argv[1:5]
    with open(elf_path, "rb") as f:
        elf_bytes = f.read()
    with open(jobs_path, "rb") as f:
        job_list = pickle.load(f)
    outs = run_jobs(elf_bytes, int(entry_hex, 16), job_list)
    with open(out_path, "wb") as f:
        pickle.dump(outs, f)
