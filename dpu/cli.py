"""The ``dpu`` command: parses arguments, calls the Python API, formats results.

Every command shares the API's code path (STYLE.md #10); output formats follow
the tools users know (ovs-ofctl dump-flows, ofproto/trace, pmd-stats-show).
"""
from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import tempfile
import time
from typing import Iterable, List, Optional, Sequence, Tuple

from . import cleanup, logs
from .errors import DpuError, DpuIOError, InvalidArgumentError, from_os_error, show_path


def _die(msg: str, code: int = 2) -> None:
    print(f"dpu: {msg}", file=sys.stderr)
    sys.exit(code)


# ---- paths the user gives: checked before anything is read or written ---------------


def _stat(path: str, what: str) -> Optional[os.stat_result]:
    """os.stat, None for a path that does not exist; other failures name the path."""
    if not path:
        raise InvalidArgumentError(f"{what}: the file name is empty")
    if "\0" in path:
        raise InvalidArgumentError(f"{what} {path!r}: a file name cannot contain a NUL byte")
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise from_os_error(e, path, what) from None


def _input_file(path: str, what: str) -> str:
    """A file the command reads: it exists and is not a directory."""
    st = _stat(path, what)
    if st is None:
        raise DpuIOError(f"{path}: no such {what}", file=path, reason="No such file or directory")
    if stat.S_ISDIR(st.st_mode):
        raise DpuIOError(f"{path}: is a directory, not a {what}", file=path, reason="Is a directory")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):  # /dev/zero would be read forever
        raise DpuIOError(f"{path}: is a device, not a {what}", file=path, reason="is a device")
    return path


def _output_dir(path: str, what: str = "--out-dir") -> str:
    """A directory the command writes into: created if missing; a file in the
    way, a read-only place or no permission is an error naming it."""
    st = _stat(path, what)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise DpuIOError(f"{path}: {what} is not a directory (a file is in the way)", file=path,
                         reason="Not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise from_os_error(e, path, f"cannot create {what}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        reason = os.strerror(30) if _read_only_fs(path) else os.strerror(13)  # EROFS, EACCES
        raise DpuIOError(f"{path}: cannot write into {what}: {reason}", file=path, reason=reason)
    return path


def _read_only_fs(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _refuse_overwrite(outputs: Iterable[str], inputs: Iterable[Tuple[str, str]]) -> None:
    """Refuses, before anything is written, an output that is any input (the
    same file by device and inode: links and other spellings included; the
    core decides, as the replayer does)."""
    from . import _core

    outputs, inputs = list(outputs), list(inputs)
    hit = _core.find_overwrite([os.fsencode(p) for p in outputs], [os.fsencode(p) for _, p in inputs])
    if hit is not None:
        out, (what, path) = outputs[hit[0]], inputs[hit[1]]
        raise InvalidArgumentError(f"{show_path(out)}: writing it would destroy the {what} "
                                   f"{show_path(path)}, an input (choose another output)", file=out)


class _atomic_output:
    """``with _atomic_output(path) as tmp:`` write ``tmp``; it becomes ``path``
    only when the block succeeds (a rename in the same directory), so a failed
    write (disk full, ...) leaves no truncated file and an old ``path`` intact.
    A path that is not a regular file (/dev/null, a FIFO), or that names a
    file descriptor (/dev/stdout, /dev/fd/N, /proc/self/fd/N), is written
    directly; through a symbolic link, the file it points to is replaced and
    the link stays."""

    def __init__(self, path: str, what: str) -> None:
        self.user_path = path
        path = _follow_links(path)  # write where a link points, keep the link
        st = _stat(path, what)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise DpuIOError(f"{path}: is a directory ({what} takes a file name)", file=path, reason="Is a directory")
        self.path, self.tmp = path, None
        if (st is None or stat.S_ISREG(st.st_mode)) and not _names_a_descriptor(path):
            d, base = os.path.split(path)
            try:
                fd, self.tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=d or ".")
                os.close(fd)
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(self.tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~umask)
            except OSError as e:
                raise from_os_error(e, path, "cannot create") from None

    def __enter__(self) -> str:
        return self.tmp or self.path

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.tmp is None:
            return False
        if exc_type is None:
            try:
                os.replace(self.tmp, self.path)
                return False
            except OSError as e:
                _remove_incomplete([self.tmp])
                raise from_os_error(e, self.path, "cannot write") from None
        _remove_incomplete([self.tmp])
        if isinstance(exc, DpuError) and exc.file == self.tmp:  # name the file the user gave
            exc.file = self.user_path
            exc.args = tuple(a.replace(self.tmp, self.user_path) if isinstance(a, str) else a for a in exc.args)
            exc.message = exc.message.replace(self.tmp, self.user_path)
        return False


def _follow_links(path: str) -> str:
    """Where writing `path` writes: its symbolic links followed, one at a time,
    up to a path that names a descriptor (/dev/stdout, a link to it: written
    as it is, never resolved into /proc/PID/fd/pipe:[N]) or that is no link."""
    for _ in range(40):  # as the kernel's ELOOP limit
        if _names_a_descriptor(path) or not os.path.islink(path):
            return path
        target = os.readlink(path)
        path = target if os.path.isabs(target) else os.path.join(os.path.dirname(path) or ".", target)
    return path


def _names_a_descriptor(path: str) -> bool:
    """/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N and the like: a
    stream the caller opened, to be written, never replaced."""
    p = os.path.abspath(path)
    return p in ("/dev/stdout", "/dev/stderr") or p.startswith(("/dev/fd/", "/proc/"))


def _is_stdout(path: str) -> bool:
    """Whether writing `path` writes this process's standard output."""
    try:
        a, b = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _remove_incomplete(paths: Iterable[str]) -> List[str]:
    """Deletes outputs a failed write left incomplete (regular files only: not
    a device such as /dev/null or /dev/full); returns those removed."""
    removed = []
    for path in paths:
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.remove(path)
                removed.append(path)
        except OSError:
            pass
    return removed


# ---- building a dataplane from --flows / --config / --ports ---------------------------


def _build(args, port_names: Sequence[str] = ()):
    """A Dataplane from --config (topology) and/or --flows, with the ports the
    command needs. Without --config or --ports, the ports the command and the
    flows mention are created; with a topology, only its own ports exist."""
    from .dataplane import Dataplane

    dp = Dataplane()
    config = getattr(args, "config", None)
    if config:
        dp.load_topology(_input_file(config, "topology file"))
    explicit = _port_list(getattr(args, "ports", None) or "")
    # A topology names its ports: a port it does not have is a typo, not a new port.
    implicit = [] if config else [(n, 0) for n in port_names]
    with dp.transaction() as t:
        have = set(dp.ports)
        for name, ofport in explicit + implicit:
            if name not in have:
                t.add_port(name, ofport)
                have.add(name)
    flows = getattr(args, "flows", None)
    if flows:
        dp.load_flows(flows, create_ports=not explicit and not config)
        _warn_tunnel_port(dp, flows, config)
    return dp


def _port_list(text: str) -> List[tuple]:
    """--ports: NAME or NAME=OFPORT, comma-separated."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, _, num = item.partition("=")
        ofport = 0
        if num:
            try:
                ofport = int(num, 0)
            except ValueError:
                ofport = -1
            from . import _core

            if not 1 <= ofport <= _core.MAX_OFPORT:  # the core's (ports.h)
                _die(f"--ports: '{item}': the OpenFlow port number must be 1..{_core.MAX_OFPORT}")
        out.append((name, ofport))
    return out


def _warn_tunnel_port(dp, flows: str, config) -> None:
    """A flows file written for a topology (dpu compile's output) names its
    tunnel port; without --config that name is an ordinary port."""
    from .topology import TUNNEL_PORT

    if not config and TUNNEL_PORT in dp.ports:
        print(f"dpu: warning: {flows} uses port '{TUNNEL_PORT}', the tunnel port of a compiled topology; "
              f"without --config it is an ordinary port (no VXLAN encapsulation or decapsulation)",
              file=sys.stderr)


def _parse_in(values: Sequence[str]) -> List[tuple]:
    out = []
    for v in values:
        if "=" not in v:
            _die(f"--in takes PORT=FILE, got '{v}'")
        port, path = v.split("=", 1)
        out.append((port, path))
    return out


# ---- progress -------------------------------------------------------------------------


from .report import Progress as _Progress  # noqa: E402 - one progress bar: replay, gen, bench, demo
from .report import show_arg as _show_arg  # noqa: E402


# ---- commands ---------------------------------------------------------------------------


def cmd_replay(args) -> int:
    inputs = _parse_in(args.inputs)
    if not args.flows and not args.config:
        _die("replay needs --flows and/or --config")
    for _, path in inputs:
        _input_file(path, "capture file")
    dp = _build(args, [p for p, _ in inputs])
    outputs = _replay_outputs(dp, args.out_dir) + ([args.drops_pcap] if args.drops_pcap else [])
    _refuse_overwrite(outputs, _given_inputs(args, inputs))
    _output_dir(args.out_dir)
    progress = _Progress(not args.no_progress)
    try:
        summary = dp.replay(inputs, args.out_dir, progress=progress, drops_pcap=args.drops_pcap)
    except DpuError as e:
        progress.close()
        partial = getattr(e, "summary", None)
        removed = []
        if isinstance(e, DpuIOError) and e.file and os.path.normpath(e.file) in map(os.path.normpath, outputs):
            removed = _drop_incomplete_outputs(partial, e.file)  # a write failed: no incomplete output stays
        if partial is not None and not args.json:
            print(partial.render(args.show))
            for port, path in partial.outputs.items():
                print(f"  {port}: {path}")
            for path in removed:
                print(f"  removed {path}: incomplete after the failed write")
        elif partial is not None:
            d = partial.as_dict()
            d["error"] = str(e)
            if removed:
                d["removed"] = removed
            print(json.dumps(d, sort_keys=True))
        raise
    progress.close()
    if args.json:
        print(summary.to_json())
    else:
        print(summary.render(args.show))
        for port, path in summary.outputs.items():
            print(f"  {port}: {path}")
    return 0


def _replay_outputs(dp, out_dir: str) -> List[str]:
    """The files a replay writes, as the core names them: one pcap per port that is not a tunnel."""
    return [path for _, path in dp._core.replay_outputs(out_dir)]


def _given_inputs(args, pcaps: Sequence[tuple] = ()) -> List[Tuple[str, str]]:
    """Every file the user gave as an input: flows file, topology, captures."""
    out = []
    if getattr(args, "flows", None):
        out.append(("flows file", args.flows))
    if getattr(args, "config", None):
        out.append(("topology file", args.config))
    out += [("capture file", path) for _, path in pcaps]
    return out


def _drop_incomplete_outputs(summary, failed: str) -> List[str]:
    """After a failed write: removes the file that failed and every other
    output whose size is not what its port sent (24-byte header, 16 bytes and
    the frame per packet), so no truncated file looks complete; the summary
    then lists only the outputs that are whole."""
    if summary is None:
        return _remove_incomplete([failed])
    suspect = [failed]
    for port, path in list(summary.outputs.items()):
        c = summary.ports.get(port, {})
        want = 24 + 16 * c.get("tx_packets", 0) + c.get("tx_bytes", 0)
        try:
            whole = os.path.getsize(path) == want and path != failed
        except OSError:
            whole = False
        if not whole:
            suspect.append(path)
            del summary.outputs[port]
    return _remove_incomplete(dict.fromkeys(suspect))


def _ctl_alone(args, command: str) -> None:
    """Refuses --ctl together with the options that build a dataplane offline:
    the command would otherwise have to ignore one of them."""
    given = [opt for opt, attr in (("--flows", "flows"), ("--config", "config"), ("--ports", "ports"),
                                   ("a flows file", "file")) if getattr(args, attr, None)]
    if args.ctl and given:
        _die(f"{command} --ctl acts on the running dpu: {' and '.join(given)} "
             f"{'is' if len(given) == 1 else 'are'} for offline use (give one or the other)")


def cmd_trace(args) -> int:
    _ctl_alone(args, "trace")
    if not args.flows and not args.config and not args.ctl:
        _die("trace needs --flows and/or --config, or --ctl for a running dpu")
    if args.hex is not None and args.packet is not None:
        _die("trace takes a scapy expression or --hex, not both")
    if args.hex is not None:
        data = _hex_arg(args.hex)
    elif args.packet is not None:
        from .packet_expr import build

        try:
            data = build(args.packet, "packet")
        except InvalidArgumentError as e:
            _die(f"cannot build packet from {args.packet!r}: {e.reason}")
    else:
        _die("trace needs a scapy expression or --hex")
    if args.ctl:
        r = _ctl(args, "trace", in_port=args.in_port, hex=data.hex())
        print(json.dumps(r["json"], indent=2) if args.json else r["text"])
        return 0
    dp = _build(args, [args.in_port])
    tr = dp.trace(data, args.in_port)
    if args.json:
        from dataclasses import asdict

        d = asdict(tr)
        d["outputs"] = [{"port": p, "hex": b.hex()} for p, b in tr.outputs]
        print(json.dumps(d, indent=2))
    else:
        print(tr)
    return 0


def _hex_arg(text: str) -> bytes:
    """--hex: hexadecimal bytes, optionally separated by ':' or blanks (as tcpdump -xx and Wireshark copy them)."""
    digits = "".join(text.replace(":", " ").replace("-", " ").split())
    if digits[:2].lower() == "0x":
        digits = digits[2:]
    if not digits:
        raise InvalidArgumentError("--hex: the hex string is empty")
    for i, ch in enumerate(digits):
        if ch not in "0123456789abcdefABCDEF":
            raise InvalidArgumentError(f"--hex: {ch!r} (digit {i + 1}) is not a hexadecimal digit")
    if len(digits) % 2:
        raise InvalidArgumentError(f"--hex: {len(digits)} hex digits is not a whole number of bytes")
    return bytes.fromhex(digits)


def cmd_flows(args) -> int:
    _ctl_alone(args, "flows")
    if args.ctl:
        return cmd_dump_flows(argparse.Namespace(ctl=args.ctl, match="", strict=False, json=args.json))
    dp = _build(args)
    if args.json:
        _print_json({"groups": [g.as_dict() for g in dp.dump_groups()], "flows": [f.as_dict() for f in dp.dump_flows()]})
        return 0
    # Groups first, as group_id= lines: the listing reads back as a flows file.
    for g in dp.dump_groups():
        print(g.text)
    for f in dp.dump_flows():
        print(f.spec if args.plain else f)
    return 0


def cmd_compile(args) -> int:
    from .topology import compile_topology, load_topology

    comp = compile_topology(load_topology(_input_file(args.topology, "topology file")))
    if args.check:
        from .dataplane import Dataplane

        Dataplane.from_topology(comp.topology)
    if args.json:
        _print_json(comp.as_dict())
    else:
        sys.stdout.write(comp.text())
    return 0


def cmd_gen(args) -> int:
    from . import gen

    vary = {}
    for v in args.vary or []:
        if "=" not in v:
            _die(f"--vary takes FIELD=RANGE, got '{v}'")
        k, r = v.split("=", 1)
        vary[k] = r
    t0 = time.perf_counter()
    progress = _Progress(True, "generating")
    with _atomic_output(args.output, "-o") as tmp:
        try:
            n = gen.generate_pcap(tmp, args.template, args.count, flows=args.flows, vary=vary or None,
                                  size=args.size, seed=args.seed, progress=progress)
        finally:
            progress.close()
    dt = time.perf_counter() - t0
    from .report import rate_text

    # Onto stderr when the capture went to stdout (-o /dev/stdout): not into the capture.
    where = sys.stderr if _is_stdout(args.output) else sys.stdout
    if args.json:
        print(json.dumps({"packets": n, "output": args.output, "seconds": round(dt, 6),
                          "pps": round(n / dt, 1) if dt > 0 else None}, sort_keys=True), file=where)
        return 0
    print(f"wrote {n} packets to {args.output} in {dt:.2f}s ({rate_text(n / dt) if dt > 0 else '-'})", file=where)
    return 0


def cmd_bench(args) -> int:
    from . import _core, bench
    from .livebench import LIVE_SCENARIOS

    names = args.scenarios or list(bench.SCENARIOS)
    for name in names:
        if name not in bench.SCENARIOS and name not in LIVE_SCENARIOS:
            _die(f"unknown scenario '{name}' (known: {', '.join(list(bench.SCENARIOS) + list(LIVE_SCENARIOS))})")
    workers = _int_list(args.workers, "--workers")
    ios = [x for x in args.io.split(",") if x]
    for x in ios:
        if x not in _core.IO_BACKENDS:  # those this build has (the binding's list)
            _die(f"--io takes {' and/or '.join(_core.IO_BACKENDS)}, got '{x}'")
    for name in names:
        if name in LIVE_SCENARIOS:
            from .livebench import render, run_live

            flows = _int_list(args.flows, "--flows") if args.flows else (1000, 100_000)
            for res in run_live(name, repeat=min(args.repeat, 3), workers=workers, io=ios, flows=flows,
                                burst=args.burst):
                print(json.dumps(res, sort_keys=True) if args.json else render(res), flush=True)
            continue
        progress = _Progress(True, name, show_rate=False)
        try:
            res = bench.run(name, packets=args.packets, repeat=args.repeat, stages=args.stages, progress=progress,
                            burst=args.burst)
        finally:
            progress.close()
        if args.json:
            print(json.dumps(res, sort_keys=True), flush=True)
        else:
            print(bench.render(res), flush=True)
    return 0


def cmd_ct(args) -> int:
    """dpu ct dump|flush: the connection table after replaying captures
    (--in), or, with --ctl, of a running instance."""
    if args.ctl:
        if args.inputs or args.flows or args.config:
            _die("ct --ctl acts on the running dpu: --in, --flows and --config are for offline use")
        if args.action == "flush":
            n = _ctl(args, "ct-flush", zone=args.zone)
            if args.json:
                _print_json({"flushed": n})
            else:
                print(f"flushed {n} connections")
        else:
            _print_rows(_ctl(args, "ct-dump", zone=args.zone, **_json_request(args)), "connections", args)
        return 0
    if args.action == "flush":
        _die("ct flush acts on a running dataplane (dpu run --ctl PATH); offline, a replay starts with an empty table")
    if not args.inputs:
        _die("ct dump needs captures to replay (--in PORT=FILE) to build the table from")
    if not args.flows and not args.config:
        _die("ct dump needs --flows and/or --config")
    inputs = _parse_in(args.inputs)
    for _, path in inputs:
        _input_file(path, "capture file")
    dp = _build(args, [p for p, _ in inputs])
    if args.out_dir:
        _refuse_overwrite(_replay_outputs(dp, args.out_dir), _given_inputs(args, inputs))
        _output_dir(args.out_dir)
    with cleanup.TempDir(prefix="dpu-ct-") as tmp:  # removed on SIGTERM too
        dp.replay(inputs, args.out_dir or tmp)
    _print_rows(dp.conntrack(zone=args.zone), "connections", args)
    return 0


def cmd_run(args) -> int:
    from .live import LiveOptions, parse_port_args, run

    opts = LiveOptions(ports=parse_port_args(args.port), config=args.config, flows=args.flows, workers=args.workers,
                       io=args.io, ctl=None if args.no_ctl else args.ctl, metrics=args.metrics, burst=args.burst,
                       drops_pcap=args.drops_pcap, pidfile=args.pidfile)
    return run(opts)


# ---- commands on a running instance (--ctl) -------------------------------------------------


def _default_ctl(args) -> None:
    """A command that acts on a running dpu and was given no --ctl: the default socket."""
    if not args.ctl:
        from .live import DEFAULT_CTL

        args.ctl = DEFAULT_CTL


def _ctl(args, cmd: str, **kw):
    from .control import call

    return call(args.ctl, cmd, **kw)


def _json_request(args) -> dict:
    """A dump's ``json`` argument, sent only when asked: a dpu started before it existed still answers."""
    return {"json": True} if args.json else {}


def _print_json(obj) -> None:
    print(json.dumps(obj, sort_keys=True))


def _print_rows(rows, key: str, args) -> None:
    """A dump: one line per row, or with --json one object ``{key: [row's fields, ...]}`` (rows
    from the control socket come as fields already; offline ones are Flow, Group, Connection)."""
    if args.json:
        _print_json({key: [r if isinstance(r, dict) else r.as_dict() for r in rows]})
        return
    for r in rows:
        print(r)


def cmd_dump_flows(args) -> int:
    _print_rows(_ctl(args, "dump-flows", match=args.match or "", strict=args.strict, **_json_request(args)),
                "flows", args)
    return 0


def cmd_add_flow(args) -> int:
    _ctl(args, "add-flows", flows=[[1, args.flow]], file=None)
    return 0


def cmd_add_flows(args) -> int:
    from .dataplane import read_flows_file

    numbered = read_flows_file(args.file)  # a file it cannot read: DpuIOError naming it
    n = _ctl(args, "add-flows", flows=[list(x) for x in numbered], file=args.file)
    print(f"added {n} flows")
    return 0


def cmd_mod_flows(args) -> int:
    n = _ctl(args, "mod-flows", flow=args.flow, strict=args.strict)
    print(f"modified {n} flows")
    return 0


def cmd_del_flows(args) -> int:
    n = _ctl(args, "del-flows", match=args.match or "", strict=args.strict)
    print(f"deleted {n} flows")
    return 0


def cmd_dump_groups(args) -> int:
    _print_rows(_ctl(args, "dump-groups", **_json_request(args)), "groups", args)
    return 0


def cmd_stats(args) -> int:
    st = _ctl(args, "stats")
    if args.json:
        _print_json(st)
        return 0
    from .report import counter_tables, interfaces_table, table

    if st.get("cleared_seconds_ago") is not None:
        print(f"Counters since dpu clear-stats {st['cleared_seconds_ago']:.1f}s ago.\n")
    print(counter_tables(st, zones=st.get("tenant_zones") or []))  # as the final report: per tenant's zone
    if st.get("interfaces"):
        print("\nInterfaces:")
        print(interfaces_table(st["interfaces"]))
    if st.get("workers"):
        print("\nWorkers:")
        rows = []
        for i, w in enumerate(st["workers"]):
            t = w["busy_ns"] + w["idle_ns"]
            rows.append([i if i else "0 (api)", w["packets"], w["batches"],
                         f"{w['packets'] / w['batches']:.1f}" if w["batches"] else "-",
                         f"{w['busy_ns'] / t:.1%}" if t else "-", w["megaflows"]])
        print(table(rows, ["worker", "packets", "batches", "pkts/batch", "busy", "megaflows"]))
    for name, h in (st.get("nexthops") or {}).items():
        print(f"next hop {name} {h['ip']} on {h['interface']}: {h['state']}" + (f" at {h['mac']}" if h["mac"] else ""))
    return 0


def cmd_dump_megaflows(args) -> int:
    """ovs-appctl dpctl/dump-flows: each worker's megaflows, under a line naming it."""
    rows = _ctl(args, "dump-megaflows")
    if args.json:
        _print_json({"megaflows": rows})  # as every dump's --json: {key: [row's fields, ...]}
        return 0
    from .dataplane import Megaflow

    last = None
    for r in rows:
        if r["worker"] != last:
            last = r["worker"]
            print(f"flow-dump from worker {last}" + (" (api)" if last == 0 else "") + ":")
        print(Megaflow(r["worker"], r["match"], r["n_packets"], r["n_bytes"], r["actions"],
                       -1 if r["used"] is None else r["used"]))
    return 0


def cmd_replace_flows(args) -> int:
    """ovs-ofctl replace-flows: the running dpu's flows and groups become the file's."""
    from .dataplane import read_flows_file

    numbered = read_flows_file(_input_file(args.file, "flows file"))
    r = _ctl(args, "replace-flows", flows=[list(x) for x in numbered], file=args.file)
    print(f"replaced: flows {r['flows_added']} added, {r['flows_modified']} modified, {r['flows_deleted']} deleted, "
          f"{r['flows_unchanged']} unchanged; groups {r['groups_added']} added, {r['groups_modified']} modified, "
          f"{r['groups_deleted']} deleted; version {r['version']}")
    return 0


def cmd_diff_flows(args) -> int:
    """ovs-ofctl diff-flows: exit 0 when the sources hold the same flows and groups,
    2 when they differ (1 for an error, as every command)."""
    from . import flowdiff
    from .control import call
    from .dataplane import Dataplane, read_flows_file

    live = {}  # a running dpu's table and ports, by source
    for src in (args.source1, args.source2):
        if flowdiff.source_kind(src) == "ctl":
            live[src] = call(src[len("unix:"):] if src.startswith("unix:") else src, "flow-table")
    ports = next(iter(live.values()))["ports"] if live else ()
    tables = []
    for src in (args.source1, args.source2):
        if src in live:
            tables.append(flowdiff.FlowTable.from_json(live[src]))
        else:  # a file, read with a running dpu's ports when one is compared
            tables.append(flowdiff.read_table(Dataplane(), read_flows_file(_input_file(src, "flows file")), src,
                                              ports))
    lines = flowdiff.diff_lines(*tables)
    for line in lines:
        print(line)
    return 2 if lines else 0


def cmd_clear_stats(args) -> int:
    _ctl(args, "clear-stats")
    print("cleared: dpu stats counts from now (rules, megaflows, conntrack, metrics and the final report untouched)")
    return 0


def cmd_reload(args) -> int:
    from .live import reload_text

    text, warnings = reload_text(_ctl(args, "reload"))
    print(text)
    for w in warnings:
        print(f"dpu: warning: {w}", file=sys.stderr)
    return 0


def cmd_show(args) -> int:
    _ctl_alone(args, "show")
    if args.flows or args.config or args.ports:
        return _show_offline(args)
    _default_ctl(args)
    s = _ctl(args, "show")
    if args.json:
        _print_json(s)
        return 0
    print(f"dpu pid {s['pid']}: {s['workers']} worker(s) on {s['io']}, up {s['uptime']:.0f}s"
          + (f", config {s['config']}" if s["config"] else "") + (f", flows {s['flows']}" if s["flows"] else ""))
    for p in s["ports"]:
        where = "tunnel" if p["tunnel"] else (p["interface"] or "(no interface)")
        print(f" {p['ofport']}({p['name']}): {where}")
    for name, h in s["nexthops"].items():
        print(f" next hop {name} {h['ip']} on {h['interface']}: {h['state']}" + (f" at {h['mac']}" if h["mac"] else ""))
    return 0


def _show_offline(args) -> int:
    """`ovs-ofctl show` for the ports a command would build: OpenFlow number and name."""
    dp = _build(args)
    rows = [{"ofport": p["ofport"], "name": p["name"], "tunnel": bool(p.get("tunnel"))} for p in dp.port_info()]
    if args.json:
        _print_json({"ports": rows})
        return 0
    for r in sorted(rows, key=lambda r: r["ofport"]):
        print(f" {r['ofport']}({r['name']})" + (": tunnel" if r["tunnel"] else ""))
    return 0


def cmd_evpn(args) -> int:
    """The fabric: offline what a topology configures, live (--ctl) also what FRR installed."""
    _ctl_alone(args, "evpn")
    if args.config:
        from .mirror import evpn_view
        from .topology import load_topology

        view = evpn_view(load_topology(args.config))
    else:
        _default_ctl(args)
        view = _ctl(args, "evpn")
    if args.json:
        _print_json(view)
        return 0
    from .mirror import evpn_text

    print(evpn_text(view), end="")
    return 0


def cmd_demo(args) -> int:
    if args.fabric:
        from .demo_fabric import run_fabric_demo

        return run_fabric_demo(as_json=args.json)
    from .demo import run_demo

    _output_dir(args.out_dir)
    return run_demo(out_dir=args.out_dir, packets=args.packets, as_json=args.json)


def cmd_completion(args) -> int:
    from .completion import script

    sys.stdout.write(script(args.shell, _parser()))
    return 0


# ---- main ----------------------------------------------------------------------------------


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" for every option with a default its help does not
    already state (no "(default: None)" or "(default: False)")."""

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if ("default" in text.lower() or d is None or d is False or d == [] or d is argparse.SUPPRESS
                or action.required or not (action.option_strings or action.nargs in ("?", "*"))):
            return text
        return text + " (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """Every command's parser: defaults in --help, and a usage error that ends
    in one "dpu: COMMAND: ..." line like every other error."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        cmd = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        self.exit(2, f"dpu: {cmd + ': ' if cmd else ''}{message}\n")


def _int_arg(lo: int, hi: Optional[int] = None):
    """An argparse type: a whole number in lo..hi (decimal or 0x hex)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            try:
                v = int(text, 0)
            except ValueError:
                raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if v < lo or (hi is not None and v > hi):
            want = f"{lo}..{hi}" if hi is not None else ("positive" if lo == 1 else f"at least {lo}")
            raise argparse.ArgumentTypeError(f"must be {want}, got {v}")
        return v

    return parse


def _version() -> str:
    """The version of the code that runs (dpu.__version__, pyproject.toml's, checked by a test)."""
    from . import __version__

    return __version__


def _parser() -> argparse.ArgumentParser:
    from . import _core

    p = _Parser(prog="dpu", description="A userspace packet dataplane.")
    p.add_argument("--version", action="version",  # and which build of the core runs (dpu/_core.py)
                   version=f"dpu {_version()}, core {_core.BUILD_ISA} ({_core._loaded_because})")
    logs.add_arguments(p, top=True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def pipeline_args(sp):
        sp.add_argument("--flows", help="flows file (ovs-ofctl syntax, one per line, # comments)")
        sp.add_argument("--config", help="tenant topology file (YAML)")
        sp.add_argument("--ports", metavar="NAME[=OFPORT],...",
                        help="comma-separated port names, each with its OpenFlow port number if wanted "
                             "(default: every port the flows name, numbered 1, 2, ... in order of appearance; "
                             "`dpu show` lists them)")

    def json_arg(sp, what: str):
        sp.add_argument("--json", action="store_true", help=f"print {what}")

    from .live import DEFAULT_CTL

    def ctl_arg(sp, required_default=True):
        if required_default:
            sp.add_argument("--ctl", default=DEFAULT_CTL, metavar="PATH",
                            help=f"control socket of the running dpu (default {DEFAULT_CTL})")
        else:
            sp.add_argument("--ctl", default=None, metavar="PATH",
                            help=f"act on the running dpu at this control socket (e.g. {DEFAULT_CTL})")

    sp = sub.add_parser("demo", help="run the built-in topology and traffic through the pipeline")
    sp.add_argument("--out-dir", default="dpu-demo", help="where to write input and output pcaps")
    sp.add_argument("--packets", type=_int_arg(1), default=200_000,
                    help="packets of generated traffic (at least one per traffic stream is sent, "
                         "and the SYN flood's 3,000 that exceed red's quota)")
    sp.add_argument("--json", action="store_true", help="print the summary as JSON")
    sp.add_argument("--fabric", action="store_true",
                    help="the EVPN fabric scene instead: learned MACs, routes and router MACs, offline")
    sp.set_defaults(func=cmd_demo)

    sp = sub.add_parser("replay", help="replay pcaps through the pipeline, one output pcap per port")
    pipeline_args(sp)
    sp.add_argument("--in", dest="inputs", action="append", default=[], metavar="PORT=FILE", required=True,
                    help="input capture for a port (repeatable)")
    sp.add_argument("--out-dir", required=True,
                    help="directory for <port>.pcap outputs (created if missing; an output that is an input is refused)")
    sp.add_argument("--json", action="store_true", help="print the summary as JSON (every view's data)")
    sp.add_argument("--show", type=_show_arg, default=["ports"], metavar="VIEW,...",
                    help="what to print after the replay, comma-separated: ports (ovs-ofctl dump-ports), flows "
                         "(dump-flows: per-rule counts), tables (dump-tables), groups (dump-groups), megaflows "
                         "(ovs-appctl dpctl/dump-flows), workers (dpif-netdev/pmd-stats-show: cache hits), or all; "
                         "the OVS command names work too (default: ports)")
    sp.add_argument("--drops-pcap", metavar="FILE", default=None,
                    help="write every dropped packet to FILE (pcapng; each packet's comment names its drop reason "
                         "and port: Wireshark's frame.comment)")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar")
    sp.set_defaults(func=cmd_replay)

    sp = sub.add_parser("trace", help="show how one packet goes through the tables (like ofproto/trace)")
    pipeline_args(sp)
    sp.add_argument("--in-port", required=True, help="port the packet arrives on")
    sp.add_argument("--hex", help="the packet as hex bytes")
    sp.add_argument("--json", action="store_true", help="print the trace as JSON")
    sp.add_argument("packet", nargs="?", help="scapy expression, e.g. 'Ether()/IP(dst=\"10.0.0.5\")/UDP()'")
    ctl_arg(sp, False)
    sp.set_defaults(func=cmd_trace)

    sp = sub.add_parser("ct", help="the connection table (like ovs-appctl dpctl/dump-conntrack)")
    sp.add_argument("action", choices=["dump", "flush"], help="dump: print the connections; flush: remove them")
    pipeline_args(sp)
    sp.add_argument("--zone", type=_zone_arg, default=None, help="only this conntrack zone (0..65535)")
    sp.add_argument("--in", dest="inputs", action="append", default=[], metavar="PORT=FILE",
                    help="capture to replay first, building the table (repeatable)")
    sp.add_argument("--out-dir", default=None, help="where the replay writes its outputs (default: discarded)")
    json_arg(sp, "the result as JSON: dump {connections: [{proto, orig, reply, zone, mark, labels, protoinfo, "
                 "...}]}, flush {flushed: N}")
    ctl_arg(sp, False)
    sp.set_defaults(func=cmd_ct)

    sp = sub.add_parser("flows", help="load flows (and/or a topology) and print them as dump-flows does")
    pipeline_args(sp)
    sp.add_argument("file", nargs="?", help="flows file (same as --flows)")
    sp.add_argument("--plain", action="store_true", help="print re-loadable flows without counters")
    json_arg(sp, "the groups and flows as JSON: {groups: [...], flows: [...]}, each with its fields")
    ctl_arg(sp, False)
    sp.set_defaults(func=lambda a: cmd_flows(a if a.ctl else _merge_file(a)))

    sp = sub.add_parser("compile", help="print the flows a tenant topology compiles to")
    sp.add_argument("topology", help="topology file (YAML)")
    sp.add_argument("--check", action="store_true", help="also load the result into a dataplane")
    json_arg(sp, "the listing as JSON: ports, tenants, groups and flows split into their fields, "
                 "each with its section")
    sp.set_defaults(func=cmd_compile)

    sp = sub.add_parser("gen", help="generate traffic from a scapy template into a pcap")
    sp.add_argument("template", help="scapy expression, e.g. 'Ether()/IP()/UDP()'")
    sp.add_argument("-n", "--count", type=_int_arg(1), default=1000, help="number of packets")
    sp.add_argument("--flows", type=_int_arg(1), default=None,
                    help="number of distinct flows (default: every packet its own flow when --vary is given)")
    sp.add_argument("--vary", action="append", metavar="FIELD=RANGE",
                    help="field to vary per flow, e.g. nw_dst=10.0.0.0/16 or tp_src=1000-2000; fields: "
                         "dl_src, dl_dst, dl_vlan, nw_src, nw_dst, nw_ttl, ipv6_src, ipv6_dst, tp_src, tp_dst "
                         "(also eth.src, ip.dst, udp.sport, ... and ip.tos, ipv6.hlim)")
    sp.add_argument("--size", type=_int_arg(14, 262144), default=None,
                    help="frame size in bytes, padded (default: the template's own size)")
    sp.add_argument("--seed", type=_int_arg(0), default=0,
                    help="0: each field's values in order; other values permute them reproducibly")
    sp.add_argument("-o", "--output", required=True, help="output pcap")
    json_arg(sp, "the summary as JSON: packets, output, seconds, pps")
    sp.set_defaults(func=cmd_gen)

    sp = sub.add_parser("run", help="forward between Linux interfaces until SIGINT/SIGTERM, reload on SIGHUP "
                                    "(the live dataplane)")
    sp.add_argument("--config", help="tenant topology file (YAML)")
    sp.add_argument("--flows", help="flows file (on top of the topology's, or alone)")
    sp.add_argument("--port", action="append", default=[], metavar="NAME=INTERFACE", required=True,
                    help="attach a port to a Linux interface (repeatable)")
    sp.add_argument("--workers", type=_int_arg(1, 64), default=1, help="forwarding worker threads, 1..64 (default 1)")
    sp.add_argument("--io", default="afpacket", choices=_core.IO_BACKENDS,
                    help="I/O backend (default afpacket; those this build has, as dpu demo says)")
    sp.add_argument("--ctl", default=DEFAULT_CTL, metavar="PATH", help=f"control socket (default {DEFAULT_CTL})")
    sp.add_argument("--no-ctl", action="store_true", help="no control socket")
    sp.add_argument("--metrics", metavar="[HOST:]PORT", default=None,
                    help="serve Prometheus metrics here (off by default; host defaults to 127.0.0.1)")
    sp.add_argument("--burst", type=_int_arg(1, _core.MAX_BURST), default=_core.DEFAULT_BURST,
                    help=f"frames a worker takes from a queue at a time (1-{_core.MAX_BURST}, "
                         f"default {_core.DEFAULT_BURST})")
    sp.add_argument("--drops-pcap", metavar="FILE", default=None,
                    help="write every dropped packet to FILE while running (pcapng, as dpu replay --drops-pcap: "
                         "each packet's comment names its drop reason and port)")
    sp.add_argument("--pidfile", metavar="PATH", default=None,
                    help="write dpu's process id to PATH once it forwards, remove it at exit (refused if it names "
                         "a running process)")
    sp.set_defaults(func=cmd_run)

    sp = sub.add_parser("dump-flows", help="print the running dpu's flows (ovs-ofctl dump-flows)")
    sp.add_argument("match", nargs="?", help="only the flows this match selects")
    sp.add_argument("--strict", action="store_true", help="exactly this match and priority")
    json_arg(sp, "the flows as JSON: {flows: [{table, priority, cookie, match, actions, n_packets, ...}]}")
    ctl_arg(sp)
    sp.set_defaults(func=cmd_dump_flows)

    sp = sub.add_parser("add-flow", help="add one flow to the running dpu (ovs-ofctl add-flow)")
    sp.add_argument("flow")
    ctl_arg(sp)
    sp.set_defaults(func=cmd_add_flow)

    sp = sub.add_parser("add-flows", help="add a file's flows to the running dpu, all or none")
    sp.add_argument("file")
    ctl_arg(sp)
    sp.set_defaults(func=cmd_add_flows)

    sp = sub.add_parser("mod-flows", help="change the actions of the running dpu's flows (ovs-ofctl mod-flows)")
    sp.add_argument("flow")
    sp.add_argument("--strict", action="store_true", help="exactly this match and priority")
    ctl_arg(sp)
    sp.set_defaults(func=cmd_mod_flows)

    sp = sub.add_parser("del-flows", help="delete the running dpu's flows (ovs-ofctl del-flows)")
    sp.add_argument("match", nargs="?", help="only the flows this match selects (default: all)")
    sp.add_argument("--strict", action="store_true", help="exactly this match and priority")
    ctl_arg(sp)
    sp.set_defaults(func=cmd_del_flows)

    sp = sub.add_parser("dump-groups", help="print the running dpu's groups")
    json_arg(sp, "the groups as JSON: {groups: [{group_id, type, buckets, n_packets, n_bytes}]}")
    ctl_arg(sp)
    sp.set_defaults(func=cmd_dump_groups)

    sp = sub.add_parser("stats", help="the running dpu's counters (ports, tables, tenants, conntrack, workers)")
    sp.add_argument("--json", action="store_true", help="print the counters as JSON")
    ctl_arg(sp)
    sp.set_defaults(func=cmd_stats)

    sp = sub.add_parser("dump-megaflows", help="the running dpu's megaflows per worker: masked match, packets, "
                                               "bytes, used, datapath actions (ovs-appctl dpctl/dump-flows)")
    sp.add_argument("--json", action="store_true", help="print the megaflows as JSON")
    ctl_arg(sp)
    sp.set_defaults(func=cmd_dump_megaflows)

    sp = sub.add_parser("replace-flows", help="make the running dpu's flows and groups a file's, changing only the "
                                              "difference in one transaction (ovs-ofctl replace-flows)")
    sp.add_argument("file", help="flows file (as dpu flows --plain and dpu compile write them)")
    ctl_arg(sp)
    sp.set_defaults(func=cmd_replace_flows)

    sp = sub.add_parser("diff-flows", help="print the flows and groups that differ between two sources, each a "
                                           "flows file or a running dpu's control socket (ovs-ofctl diff-flows); "
                                           "exit 0: none, 2: some")
    sp.add_argument("source1", help="a flows file, or a control socket (unix:PATH, or a path that is a socket)")
    sp.add_argument("source2", help="the same")
    sp.set_defaults(func=cmd_diff_flows)

    sp = sub.add_parser("clear-stats", help="dpu stats counts from now on (ovs-appctl dpif-netdev/pmd-stats-clear); "
                                            "rules, megaflows, conntrack and metrics are untouched")
    ctl_arg(sp)
    sp.set_defaults(func=cmd_clear_stats)

    sp = sub.add_parser("reload", help="re-read the running dpu's topology (and flows) file, atomically")
    ctl_arg(sp)
    sp.set_defaults(func=cmd_reload)

    sp = sub.add_parser("show", help="ports with their OpenFlow numbers (ovs-ofctl show): of the running dpu, "
                                     "or of --config/--flows/--ports")
    json_arg(sp, "the ports (and, live, pid, workers, I/O, uptime, next hops) as JSON")
    pipeline_args(sp)
    ctl_arg(sp, required_default=False)
    sp.set_defaults(func=cmd_show)

    sp = sub.add_parser("evpn", help="the EVPN fabric: VNIs, VTEPs, MACs and IPs with their route type, router MACs "
                                     "(of the running dpu, or of --config offline)")
    sp.add_argument("--config", metavar="TOPOLOGY", help="a topology file: what it configures, offline")
    sp.add_argument("--json", action="store_true")
    ctl_arg(sp, required_default=False)
    sp.set_defaults(func=cmd_evpn)

    sp = sub.add_parser("bench", help="measure packet rates (Mpps, ns/packet)")
    from .bench import SCENARIOS
    from .livebench import LIVE_SCENARIOS

    sp.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                    help=f"scenarios to run (default: all but live-*): {', '.join(list(SCENARIOS) + list(LIVE_SCENARIOS))}")
    sp.add_argument("--json", action="store_true", help="one JSON object per line per scenario")
    sp.add_argument("--packets", type=_int_arg(1), default=None,
                    help="packets per measured run (default: 10,000,000)")
    sp.add_argument("--repeat", type=_int_arg(1), default=5,
                    help="measured runs; the median is reported (replay-10m and live-*: at most 3)")
    sp.add_argument("--stages", action="store_true", help="also measure ns/packet per stage")
    sp.add_argument("--workers", default="1,2", help="live-*: worker counts to measure (default 1,2)")
    sp.add_argument("--io", default="afpacket",
                    help=f"live-*: I/O backends, comma-separated ({', '.join(_core.IO_BACKENDS)})")
    sp.add_argument("--flows", default=None, help="live-*: flow counts, comma-separated (default 1000,100000)")
    sp.add_argument("--burst", type=_int_arg(1, _core.MAX_BURST), default=_core.DEFAULT_BURST,
                    help=f"frames a worker takes from a queue at a time, as dpu run --burst (1-{_core.MAX_BURST}, "
                         f"default {_core.DEFAULT_BURST}; Open vSwitch takes 32)")
    sp.set_defaults(func=cmd_bench)

    from .completion import SHELLS

    sp = sub.add_parser("completion", help="print the shell completion script for dpu (bash or zsh)",
                        description="Prints a completion script generated from dpu's own argument parser. "
                                    "bash: source <(dpu completion bash); zsh: source <(dpu completion zsh).")
    sp.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    sp.set_defaults(func=cmd_completion)
    for sp in sub.choices.values():  # before or after the command's name
        logs.add_arguments(sp)
    return p


def _int_list(text: str, what: str) -> List[int]:
    try:
        out = [int(x) for x in text.split(",") if x]
    except ValueError:
        _die(f"{what} takes comma-separated numbers, got '{text}'")
    if not out or any(v < 1 for v in out):
        _die(f"{what} takes positive numbers, got '{text}'")
    return out


def _zone_arg(text: str) -> int:
    try:
        z = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"zone must be a number 0..65535, got '{text}'")
    if not 0 <= z <= 65535:
        raise argparse.ArgumentTypeError(f"zone must be 0..65535, got {z}")
    return z


def _merge_file(args):
    if args.file and not args.flows:
        args.flows = args.file
    if not args.flows and not args.config:
        _die("flows needs a flows file and/or --config")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The dpu command. Every failure ends in one "dpu: ..." line on stderr
    and a non-zero exit: 2 for a usage error, 1 for an error naming the file,
    line, column or record, 70 for a bug (no Python traceback unless
    DPU_TRACEBACK=1 asks for it)."""
    try:
        args = _parser().parse_args(argv)
        logs.setup(args.log_level, args.log_format)
        return args.func(args) or 0
    except DpuError as e:
        msg = str(e)
        if isinstance(e.file, str) and e.file and not e.file.isprintable():  # a name with a newline: one line
            msg = msg.replace(e.file, show_path(e.file))
        logs.last_word(f"{type(e).__name__}: {msg}")
        return 1
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a file the checks above could not foresee (e.g. it vanished meanwhile)
        logs.last_word(f"{type(e).__name__}: {from_os_error(e)}")
        return 1
    except KeyboardInterrupt:
        return 130
    except MemoryError:
        logs.last_word("out of memory")
        return 1
    except Exception as e:  # noqa: BLE001 - the guard: a bug still ends in one line, not a traceback
        if os.environ.get("DPU_TRACEBACK"):
            raise
        logs.last_word(f"internal error: {type(e).__name__}: {e} (a bug in dpu; DPU_TRACEBACK=1 shows where)")
        return 70


if __name__ == "__main__":
    sys.exit(main())
