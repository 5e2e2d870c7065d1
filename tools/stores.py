"""Stores a packet, by function, in a running benchmark: what bounds the conntrack stage.

    python3 tools/stores.py SCENARIO [--build DIR] [--per FUNCTION] [--steps 60000] [--list]

The conntrack stage runs at about one store a cycle (docs/performance.md, "Pitfalls"), so a
spill the compiler adds costs time that neither callgrind's instruction count nor a static model
shows. This runs `SCENARIO`'s traffic through the core built in DIR (a checkout built in place;
default: this one), waits for its warm-up, attaches gdb, steps `--steps` instructions from an
entry of `--per` (default `dpu::TransmitStage::emit`, once a packet output) and prints, per
packet (one `--per` entry to the next), the instructions and the instructions that write memory
(stores, pushes, read-modify-writes), by function; `--list` adds each store's address, source
line and text. Run it with the Python dpu's dependencies are installed in (the venv's: it runs
the benchmark with the same interpreter). Needs gdb and objdump (binutils), and root or ptrace
permission.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile
import time

RUN = """import sys
from dpu import bench
dp, pkts, ports, info = bench.BUILDERS[sys.argv[1]]()
print("measuring", flush=True)  # set-up done: what follows is the scenario's own traffic
dp._core.bench(pkts.data.tobytes(), pkts.offsets, pkts.lengths, ports, 4_000_000_000)
"""
GDB = """import gdb
pcs = []
gdb.execute("set pagination off")
b = gdb.Breakpoint("*%(addr)d")
b.ignore_count = 20
gdb.execute("continue")
for _ in range(%(steps)d):
    pcs.append(int(gdb.parse_and_eval("$pc")) - %(base)d)
    gdb.execute("si", to_string=True)
open("%(out)s", "w").write("\\n".join(map(str, pcs)))
gdb.execute("kill")
"""
STORE = re.compile(r",\s*-?(0x[0-9a-f]+)?\(%[a-z0-9]+(,%[a-z0-9]+)?(,\d)?\)$")


def core_so(build: str) -> str:
    found = sorted(glob.glob(os.path.join(build, "dpu", "_core*.so")))
    if not found:
        raise SystemExit(f"stores: no core built in {build}/dpu (setup.py build_ext --inplace)")
    return found[-1]  # the highest level built in place is the one this CPU loads


def disassemble(so: str) -> dict:
    """address -> (function, source file:line, instruction text)."""
    out = subprocess.run(["objdump", "-d", "-l", "-C", "--no-show-raw-insn", so], capture_output=True,
                         text=True, check=True).stdout
    insns, fn, src = {}, "", ""
    for line in out.splitlines():
        m = re.match(r"[0-9a-f]+ <(.*)>:$", line)
        if m:
            fn = m.group(1)
        elif line.startswith("/"):
            src = os.path.basename(line.split(" (")[0])
        else:
            m = re.match(r"\s+([0-9a-f]+):\s+(.*)$", line)
            if m:
                insns[int(m.group(1), 16)] = (fn, src, m.group(2).split("#")[0].split("<")[0].strip())
    return insns


def writes_memory(text: str) -> bool:
    op = text.split()[0]
    if op.startswith(("cmp", "test", "bt", "lea", "prefetch", "nop", "j", "call", "ret")):
        return False
    return op.startswith("push") or bool(STORE.search(text))


def entry_of(per: str, so: str, insns: dict) -> int:
    entry = next((a for a, (fn, _, _) in insns.items() if fn.split("(")[0] == per), None)
    if entry is None:
        raise SystemExit(f"stores: no function {per} in {so}")
    return entry


def trace(build: str, scenario: str, entry: int, steps: int, so: str) -> list:
    env = {**os.environ, "PYTHONPATH": build, "PYTHONHASHSEED": "0"}
    proc = subprocess.Popen([sys.executable, "-c", RUN, scenario], cwd=build, env=env, stdout=subprocess.PIPE,
                            text=True)
    try:
        base = wait_loaded(proc, so)
        with tempfile.TemporaryDirectory() as tmp:
            out, script = os.path.join(tmp, "pcs"), os.path.join(tmp, "trace.py")
            with open(script, "w") as f:
                f.write(GDB % {"addr": base + entry, "steps": steps, "base": base, "out": out})
            subprocess.run(["gdb", "-q", "-batch", "-p", str(proc.pid), "-x", script], capture_output=True,
                           timeout=600)
            if not os.path.exists(out):
                raise SystemExit("stores: gdb traced nothing (is ptrace allowed? gdb installed?)")
            return [int(x) for x in open(out).read().split()]
    finally:
        proc.kill()
        proc.wait()


def wait_loaded(proc: subprocess.Popen, so: str) -> int:
    """The core's load address once the benchmark is past its set-up and warm-up."""
    if proc.stdout.readline().strip() != "measuring":  # (set-up: up to a minute for snat-1m)
        proc.wait()
        raise SystemExit(f"stores: the benchmark exited ({proc.returncode})")
    time.sleep(3)  # the EMC and conntrack's caches warm on the measured traffic
    name = os.path.basename(so)
    with open(f"/proc/{proc.pid}/maps") as f:
        base = next((int(line.split("-")[0], 16) for line in f if name in line), None)
    if base is None:
        raise SystemExit(f"stores: {name} is not what the benchmark loaded (DPU_CORE?)")
    return base


def report(pcs: list, per_entry: int, insns: dict, listing: bool) -> None:
    marks = [i for i, pc in enumerate(pcs) if pc == per_entry]
    if len(marks) < 2:
        raise SystemExit("stores: fewer than two packets in the trace (more --steps)")
    packets = len(marks) - 1
    n_insns, n_stores, at = collections.Counter(), collections.Counter(), collections.Counter()
    for pc in pcs[marks[0]:marks[-1]]:
        fn, src, text = insns.get(pc, ("(outside the core)", "", "nop"))
        fn = fn.split("(")[0][-60:]
        n_insns[fn] += 1
        if writes_memory(text):
            n_stores[fn] += 1
            at[pc] += 1
    print(f"{packets} packets: {sum(n_insns.values()) / packets:.1f} instructions, "
          f"{sum(n_stores.values()) / packets:.1f} stores a packet")
    for fn, n in n_insns.most_common():
        print(f"  {n_stores[fn] / packets:7.2f} stores {n / packets:8.1f} instructions  {fn}")
    if listing:
        for pc, n in sorted(at.items()):
            fn, src, text = insns[pc]
            print(f"  {n / packets:5.2f}  {pc:#x}  {src:24s} {text}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", help="a dpu bench scenario (snat-est-1k, l3-rewrite-1k...)")
    ap.add_argument("--build", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--per", default="dpu::TransmitStage::emit", help="a function entered once a packet")
    ap.add_argument("--steps", type=int, default=60000, help="instructions to step (gdb: ~2,000 a second)")
    ap.add_argument("--list", action="store_true", help="every store, with its source line")
    args = ap.parse_args()
    so = core_so(args.build)
    insns = disassemble(so)
    entry = entry_of(args.per, so, insns)
    report(trace(args.build, args.scenario, entry, args.steps, so), entry, insns, args.list)
    return 0


if __name__ == "__main__":
    sys.exit(main())
