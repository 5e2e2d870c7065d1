"""A real Linux TCP session, captured between two namespaces, replayed through
the internet gateway of examples/nat-gateway.yaml both ways (issue 6, "Tests").

The client host plays blue's vm1 (10.0.0.11), the server a host on the
internet. The capture is what went over the wire between them; the test turns
it into what dpu would see on its ports (the client's frames arrive on vm1
addressed to the gateway; the server's frames arrive on the internet port,
addressed to the client's public address, as the server would have seen it)
and replays it. Every segment must come out translated, the byte streams must
arrive whole, and the connection must go through its states in order."""
import hashlib
import os
import socket
import threading
import time

import pytest
from scapy.all import IP, TCP, Ether, rdpcap, wrpcap

from dpu import Dataplane
from helpers.packets import BLUE_SNAT, GW_MAC, INET_MAC, INET_NEXTHOP_MAC, VM1_IP, VM1_MAC
import netns

NAT_TOPO = os.path.join(os.path.dirname(__file__), "..", "examples", "nat-gateway.yaml")
SERVER_IP, SERVER_PORT = "198.51.100.1", 8080
CLIENT_MAC, SERVER_MAC = "02:00:00:00:aa:01", "02:00:00:00:aa:02"
UP, DOWN = os.urandom(96_000), os.urandom(64_000)  # what the client sends, what the server answers


def recv_all(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def run_session(pair: netns.HostPair) -> None:
    """The server reads everything the client sends, answers, and both close."""
    lsock = netns.socket_in(pair.b, socket.AF_INET, socket.SOCK_STREAM)
    lsock.bind((SERVER_IP, SERVER_PORT))
    lsock.listen(1)
    got = {}

    def serve():
        conn, _ = lsock.accept()
        got["up"] = recv_all(conn, len(UP))
        conn.sendall(DOWN)
        conn.shutdown(socket.SHUT_WR)
        recv_all(conn, 1)  # until the client closes too
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    c = netns.socket_in(pair.a, socket.AF_INET, socket.SOCK_STREAM)
    c.settimeout(10)
    c.bind((VM1_IP, 0))
    c.connect((SERVER_IP, SERVER_PORT))
    c.sendall(UP)
    got["down"] = recv_all(c, len(DOWN))
    c.shutdown(socket.SHUT_WR)
    recv_all(c, 1)
    c.close()
    t.join(10)
    lsock.close()
    assert got["up"] == UP and got["down"] == DOWN  # the real session itself worked


def closed(frames) -> bool:
    """Both FINs captured, and a segment after the second (its ACK)."""
    flags = [Ether(f)[TCP].flags for f in frames]
    fins = [i for i, fl in enumerate(flags) if fl & 0x01]
    return len(fins) >= 2 and len(flags) > fins[1] + 1


@pytest.fixture(scope="module")
def session(tmp_path_factory, netns_ok):
    """The session as dpu's ports would have seen it: (vm1 frames, inet frames),
    each a list of scapy packets with their capture times."""
    if not os.path.exists("/usr/sbin/tcpdump") and not os.path.exists("/usr/bin/tcpdump"):
        pytest.skip("tcpdump is not installed (apt-get install tcpdump; CI installs it)")
    d = tmp_path_factory.mktemp("session")
    with netns.HostPair(VM1_IP, SERVER_IP, CLIENT_MAC, SERVER_MAC) as pair:
        with netns.Capture(pair.a, "veth-a", d / "wire.pcap", bpf="tcp") as cap:
            run_session(pair)
            # The sockets are closed when the last ACK is sent, not when tcpdump has read
            # it: on a loaded machine stopping at once lost the closing segments.
            deadline = time.monotonic() + 10
            while not closed(cap.frames()) and time.monotonic() < deadline:
                time.sleep(0.02)
        wire = rdpcap(str(d / "wire.pcap"))
    assert len(wire) > 20
    to_vm1, to_inet = [], []
    for p in wire:
        p = Ether(bytes(p))
        t = p.time if hasattr(p, "time") else 0
        ip_ = p[IP]
        if ip_.src == VM1_IP:   # the client sends to its gateway
            q = Ether(src=VM1_MAC, dst=GW_MAC) / ip_
            port = "vm1"
        else:                   # the server answered the client's public address
            ip_ = ip_.copy()
            ip_.dst = BLUE_SNAT
            q = Ether(src=INET_NEXTHOP_MAC, dst=INET_MAC) / ip_
            port = "inet"
        del q[IP].chksum
        del q[TCP].chksum  # veth may have left it partial; recomputed as a NIC would
        q = Ether(bytes(q))
        (to_vm1 if port == "vm1" else to_inet).append((t, q))
    return wire, to_vm1, to_inet


def stream(pkts, src):
    """The TCP byte stream `src` sent, in sequence order, each byte once."""
    segs = {}
    for p in pkts:
        if p[IP].src == src and len(p[TCP].payload):
            segs[p[TCP].seq] = bytes(p[TCP].payload)
    out = bytearray()
    syn = [p for p in pkts if p[IP].src == src and p[TCP].flags & 0x02]
    nxt = syn[0][TCP].seq + 1
    while nxt in segs:
        out += segs[nxt]
        nxt += len(segs[nxt])
    return bytes(out)


def test_session_replays_through_the_nat_both_ways(session, tmp_path):
    wire, to_vm1, to_inet = session
    for name, pkts in (("vm1", to_vm1), ("inet", to_inet)):
        for t, p in pkts:
            p.time = t
        wrpcap(str(tmp_path / f"{name}.in.pcap"), [p for _, p in pkts])
    dp = Dataplane.from_topology(NAT_TOPO)
    s = dp.replay({"vm1": str(tmp_path / "vm1.in.pcap"), "inet": str(tmp_path / "inet.in.pcap")}, tmp_path / "out")
    assert s.dropped == 0, s.drops
    out_inet = rdpcap(str(tmp_path / "out" / "inet.pcap"))
    out_vm1 = rdpcap(str(tmp_path / "out" / "vm1.pcap"))
    assert (len(out_inet), len(out_vm1)) == (len(to_vm1), len(to_inet))
    sport = to_vm1[0][1][TCP].sport
    for p in out_inet:  # the client's side, source NAT: the port is kept
        assert (p[IP].src, p[TCP].sport, p[IP].dst, p.src, p.dst) == (BLUE_SNAT, sport, SERVER_IP, INET_MAC,
                                                                      INET_NEXTHOP_MAC)
    for p in out_vm1:   # the server's side, translated back
        assert (p[IP].dst, p[TCP].dport, p.src, p.dst) == (VM1_IP, sport, GW_MAC, VM1_MAC)
    for p in list(out_inet) + list(out_vm1):  # every checksum right after the translation
        q = Ether(bytes(p))
        del q[IP].chksum
        del q[TCP].chksum
        q = Ether(bytes(q))
        assert (q[IP].chksum, q[TCP].chksum) == (p[IP].chksum, p[TCP].chksum)
    # the byte streams arrive whole, each way
    assert hashlib.sha256(stream(out_inet, BLUE_SNAT)).digest() == hashlib.sha256(UP).digest()
    assert hashlib.sha256(stream(out_vm1, SERVER_IP)).digest() == hashlib.sha256(DOWN).digest()
    [c] = dp.conntrack(zone=100)
    assert c.state == "TIME_WAIT" and c.orig["sport"] == sport


def test_session_states_in_order(session):
    """Packet by packet, the connection goes SYN_SENT, ESTABLISHED, then closes
    (CLOSING while one FIN is unanswered, TIME_WAIT once both are acknowledged),
    and no segment of the real session is ever +inv."""
    _, to_vm1, to_inet = session
    seq = sorted([(t, "vm1", p) for t, p in to_vm1] + [(t, "inet", p) for t, p in to_inet], key=lambda x: x[0])
    dp = Dataplane.from_topology(NAT_TOPO)
    states = []
    for t, port, p in seq:
        outs = dp.process(p, in_port=port, timestamps=[int(t * 1e9)])
        assert len(outs) == 1, f"{port} {p.summary()} was dropped: {dp.stats()['tenants']['blue']['drops']}"
        [c] = dp.conntrack(zone=100)
        if not states or states[-1] != c.state:
            states.append(c.state)
    assert states[:2] == ["SYN_SENT", "ESTABLISHED"], states
    assert states[-1] == "TIME_WAIT"
    assert set(states) <= {"SYN_SENT", "ESTABLISHED", "CLOSING", "TIME_WAIT"}
    assert "ct_invalid" not in dp.stats()["tenants"]["blue"]["drops"]
