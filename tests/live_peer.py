"""A tiny traffic end for the live tests, run inside a namespace (`ip netns exec NS python3 live_peer.py ...`).

  sink PORT                  accept one TCP connection, read to EOF, answer the SHA-256 of what came,
                             print "from ADDR:PORT DIGEST" (the address the server saw)
  source HOST PORT NBYTES [RATE]
                             connect, send NBYTES of deterministic bytes (at most RATE bytes/s),
                             read the sink's digest, print "ok DIGEST" when it matches what was
                             sent, else "mismatch ..."; prints "connected" once connected
  udp-echo PORT [ADDR]       answer each datagram with "ADDR:PORT|" + the datagram (until killed),
                             bound to ADDR (answers come from the address asked)
  udp-ask HOST PORT TEXT     send TEXT, print the answer (or "timeout")
  whoami PORT NAME           accept TCP connections forever, send NAME to each and close

Every socket operation has a timeout: a broken path fails the test instead of hanging it.
"""
import hashlib
import socket
import sys
import time


def payload(n: int) -> bytes:
    out = bytearray()
    h = hashlib.sha256(str(n).encode()).digest()
    while len(out) < n:
        h = hashlib.sha256(h).digest()
        out += h * 32
    return bytes(out[:n])


def listener(port: int, kind=socket.SOCK_STREAM, addr: str = "0.0.0.0") -> socket.socket:
    s = socket.socket(socket.AF_INET, kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    if kind == socket.SOCK_STREAM:
        s.listen(8)
    print("listening", flush=True)
    return s


def main(argv):
    cmd = argv[0]
    if cmd == "sink":
        s = listener(int(argv[1]))
        s.settimeout(60)
        c, addr = s.accept()
        c.settimeout(60)
        h = hashlib.sha256()
        while True:
            b = c.recv(1 << 16)
            if not b:
                break
            h.update(b)
        c.sendall(h.hexdigest().encode())
        c.close()
        print(f"from {addr[0]}:{addr[1]} {h.hexdigest()}", flush=True)
    elif cmd == "source":
        host, port, n = argv[1], int(argv[2]), int(argv[3])
        rate = int(argv[4]) if len(argv) > 4 else 0
        data = payload(n)
        c = socket.create_connection((host, port), timeout=30)
        c.settimeout(60)
        print("connected", flush=True)
        if rate:
            t0, chunk = time.monotonic(), 1 << 16
            for off in range(0, n, chunk):
                c.sendall(data[off:off + chunk])
                ahead = (off + chunk) / rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        else:
            c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            b = c.recv(128)
            if not b:
                break
            got += b
        want = hashlib.sha256(data).hexdigest()
        print(f"ok {want}" if got.decode() == want else f"mismatch sent {want} sink {got.decode()}", flush=True)
    elif cmd == "udp-echo":
        s = listener(int(argv[1]), socket.SOCK_DGRAM, argv[2] if len(argv) > 2 else "0.0.0.0")
        while True:
            b, addr = s.recvfrom(65535)
            s.sendto(f"{addr[0]}:{addr[1]}|".encode() + b, addr)
    elif cmd == "udp-ask":
        host, port, text = argv[1], int(argv[2]), argv[3]
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(2)
        for _ in range(3):
            s.sendto(text.encode(), (host, port))
            try:
                print(s.recvfrom(65535)[0].decode(), flush=True)
                return
            except socket.timeout:
                continue
        print("timeout", flush=True)
    elif cmd == "whoami":
        s = listener(int(argv[1]))
        while True:
            c, _ = s.accept()
            c.sendall(argv[2].encode())
            c.close()
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
