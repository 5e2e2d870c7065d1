"""tshark as the judge of what dpu writes: every frame decoded with IP, UDP and TCP
checksum validation on, and "nothing malformed, no bad checksum, no error" over a
whole capture (test_wire.py, test_golden.py).
"""
import subprocess

BAD = ("_ws.malformed || ip.checksum.status == 0 || udp.checksum.status == 0 || tcp.checksum.status == 0"
       " || icmp.checksum.status == 0 || icmpv6.checksum.status == 0 || _ws.expert.severity == \"Error\"")


def tshark_fields(tshark, path, fields, display=None):
    cmd = [tshark, "-n", "-r", str(path), "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
           "-o", "tcp.check_checksum:TRUE", "-T", "fields"]
    for f in fields:
        cmd += ["-e", f]
    if display:
        cmd += ["-Y", display]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [line.split("\t") for line in r.stdout.splitlines()]


def assert_clean(tshark, path, expected_frames):
    bad = tshark_fields(tshark, path, ["frame.number", "_ws.col.Protocol", "_ws.col.Info"], BAD)
    assert bad == [], f"{path}: tshark reports problems:\n" + "\n".join("\t".join(b) for b in bad)
    frames = tshark_fields(tshark, path, ["frame.number"])
    assert len(frames) == expected_frames
