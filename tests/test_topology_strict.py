"""The topology loader is strict (issue 9, "Errors and help"): a key written
twice is an error naming both places, scalars keep their YAML type, aliases and
deep nesting are refused before they cost time or memory, every error names
file:line:column and a file's mistakes come all at once, and a file that is not
UTF-8, a directory or a missing file is one clear error.

The fuzz test at the end is bounded (derandomized, a few seconds); the longer
run, with fresh random inputs each time:
``DPU_FUZZ_EXAMPLES=20000 python3 -m pytest -q tests/test_topology_strict.py -k fuzz``
"""
import os
import re
import subprocess
import sys
import textwrap

import pytest
import yaml

from dpu.cli import main
from dpu.errors import TopologyError
from dpu.topology import MAX_DEPTH, compile_topology, load_topology

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
TOPO = os.path.join(EXAMPLES, "topology.yaml")
NAT_TOPO = os.path.join(EXAMPLES, "nat-gateway.yaml")

GOOD = """\
uplink:
  port: p0
  ip: 192.0.2.1
  mac: 02:00:00:00:00:01
  nexthop_mac: 02:00:00:00:00:02
tenants:
  blue:
    vni: 100
    gateway_mac: 02:00:00:00:01:01
    subnets:
      - {cidr: 10.0.0.0/24, gateway: 10.0.0.1}
    ports:
      vm1: {mac: 02:00:00:00:01:11, ip: 10.0.0.11}
      vm2: {mac: 02:00:00:00:01:12, ip: 10.0.0.12}
"""


def write(tmp_path, text, name="t.yaml"):
    p = tmp_path / name
    p.write_text(text) if isinstance(text, str) else p.write_bytes(text)
    return str(p)


def with_uplink(field, written):
    """GOOD with uplink.<field> written as ``written`` (moved to the end of uplink:)."""
    head, tail = GOOD.split("tenants:\n", 1)
    lines = [line for line in head.splitlines() if not line.startswith(f"  {field}:")]
    return "\n".join(lines + [f"  {field}: {written}"]) + "\ntenants:\n" + tail


def error(src) -> TopologyError:
    with pytest.raises(TopologyError) as ei:
        load_topology(src)
    return ei.value


@pytest.fixture
def events(monkeypatch):
    """How many YAML parser events the loader took (a list holding one count): the
    reader's work is one step per event, so a refusal that comes early takes few."""
    loader = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader   # the class the reader uses
    count = [0]
    get_event = loader.get_event

    def counted(self):
        count[0] += 1
        return get_event(self)

    monkeypatch.setattr(loader, "get_event", counted)
    return count


def _events_before_first_alias(text: str) -> int:
    n = 0
    for e in yaml.parse(text):
        n += 1
        if isinstance(e, yaml.AliasEvent):
            return n
    raise AssertionError("no alias in the text")


def test_the_example_files_load_as_before():
    for name in ("topology.yaml", "nat-gateway.yaml"):
        path = os.path.join(EXAMPLES, name)
        with open(path) as f:
            data = yaml.safe_load(f)
        # the file, its text and PyYAML's dict of it are one topology
        texts = {compile_topology(load_topology(src)).text().split("\n", 1)[1]
                 for src in (path, open(path).read(), data)}
        assert len(texts) == 1, name


# ---- a key written twice -------------------------------------------------------------------

def test_duplicate_tenant_names_both_places(tmp_path):
    text = GOOD + """\
  blue:
    vni: 200
    gateway_mac: 02:00:00:00:01:01
    subnets:
      - {cidr: 10.0.0.0/24, gateway: 10.0.0.1}
"""
    path = write(tmp_path, text)
    e = error(path)  # before: the first blue silently disappeared
    assert (e.path, e.file, e.line, e.column) == ("tenants.blue", path, 15, 3)
    assert str(e) == (f"{path}:15:3: tenants.blue: key written twice, at {path}:7:3 and {path}:15:3 "
                      "(YAML would keep only the last; remove or rename one)")


def test_duplicate_port(tmp_path):
    path = write(tmp_path, GOOD.replace("      vm2: {mac: 02:00:00:00:01:12",
                                        "      vm1: {mac: 02:00:00:00:01:12"))
    e = error(path)
    assert e.path == "tenants.blue.ports.vm1" and (e.line, e.column) == (14, 7)
    assert f"key written twice, at {path}:13:7 and {path}:14:7" in str(e)


def test_duplicate_uplink_and_uplink_key(tmp_path):
    path = write(tmp_path, GOOD + "uplink:\n  port: p1\n  ip: 192.0.2.9\n  mac: 02:00:00:00:00:09\n"
                                  "  nexthop_mac: 02:00:00:00:00:02\n")
    e = error(path)
    assert e.path == "uplink" and f"at {path}:1:1 and {path}:15:1" in str(e)
    # in a flow mapping too, and every duplicate of a file at once
    path = write(tmp_path, GOOD.replace("  port: p0\n", "  port: p0\n  port: p1\n")
                 .replace("{cidr: 10.0.0.0/24,", "{cidr: 10.0.0.0/24, cidr: 10.0.1.0/24,"))
    e = error(path)
    assert [(x.path, x.line, x.column) for x in e.errors] == [
        ("uplink.port", 3, 3), ("tenants.blue.subnets[0].cidr", 12, 29)]


# ---- scalar types --------------------------------------------------------------------------

@pytest.mark.parametrize("written", ["'false'", '"true"', "0", "1", "[false]", "off-ish"])
def test_a_boolean_is_a_yaml_boolean(tmp_path, written):
    e = error(write(tmp_path, with_uplink("strict_vxlan", written)))
    assert e.path == "uplink.strict_vxlan" and (e.line, e.column) == (6, 17)
    assert "is not a boolean (write true or false, without quotes)" in str(e)


@pytest.mark.parametrize("written,value", [("false", False), ("true", True), ("yes", True), ("", False)])
def test_real_booleans_are_accepted(written, value):
    assert load_topology(with_uplink("strict_vxlan", written)).uplink.strict_vxlan is value


@pytest.mark.parametrize("field,written,words", [
    ("ip", "'192.0.2.1'", None),                                  # quoted strings are strings
    ("ip", "3221225985", "3221225985 is not an IP address"),
    ("mac", "12:34:56:00:00:01", "YAML read it as a number: put the MAC in quotes"),  # YAML 1.1 base 60
    ("mac", "'12:34:56:00:00:01'", None),
    ("mtu", "'1500'", "'1500' is not an integer"),
    ("mtu", "true", "True is not an integer"),
    ("port", "123", "123 is not a valid name"),
])
def test_each_scalar_checks_its_yaml_type(field, written, words):
    text = with_uplink(field, written)
    if words is None:
        load_topology(text)
        return
    e = error(text)
    assert e.path == f"uplink.{field}" and words in str(e), str(e)


# ---- aliases and nesting ---------------------------------------------------------------------

def billion_laughs(where: str) -> str:
    """Nine levels of nine aliases each: 9**9 strings if expanded."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 10)]
    return "\n".join(lines) + "\n" + GOOD.replace(f"  {where}: ", f"  {where}: *l9  # ", 1)


@pytest.mark.parametrize("where", ["ip", "mac"])
def test_alias_bomb_is_refused_at_once(where, events):
    text = billion_laughs(where)
    e = error(text)  # before: minutes, and past 1.5 GB formatting the error
    assert events[0] == _events_before_first_alias(text)  # nothing read past the first alias
    assert str(e) == ("<string>:2:10: YAML alias *l0 is not allowed in a topology file "
                      "(aliases can expand without bound): write the value out")


def test_alias_bomb_in_a_file_costs_no_time_or_memory(tmp_path):
    """In a child with a CPU limit and an address-space limit a little above what
    it uses after importing dpu: the bomb is one TopologyError line."""
    path = write(tmp_path, billion_laughs("ip"))
    child = textwrap.dedent(f"""
        import resource, sys
        from dpu.errors import TopologyError
        from dpu.topology import load_topology
        vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize:")).split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
        resource.setrlimit(resource.RLIMIT_CPU, (20, resource.RLIM_INFINITY))
        try:
            load_topology({path!r})
        except TopologyError as e:
            print(e)
    """)
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                       cwd=os.path.join(HERE, ".."))
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]  # not killed by either limit
    assert r.stdout == f"{path}:2:10: YAML alias *l0 is not allowed in a topology file " \
                       "(aliases can expand without bound): write the value out\n"


def test_anchors_without_aliases_are_harmless():
    topo = load_topology(GOOD.replace("  port: p0", "  port: &uplink p0"))
    assert topo.uplink.port == "p0"


@pytest.mark.parametrize("text", [
    "uplink: " + "[" * 100000 + "]" * 100000 + "\n",
    "uplink: " + "{a: " * 100000 + "1" + "}" * 100000 + "\n",
    "".join("  " * i + f"k{i}:\n" for i in range(1000)),
    "".join("  " * i + "-\n" for i in range(1000)),
], ids=["flow-sequences", "flow-mappings", "block-mappings", "block-sequences"])
def test_deep_nesting_is_refused(text, events):
    e = error(text)  # before: RecursionError from the YAML composer
    # stream, document, top mapping and its key, then at most two events a level (a key and
    # the mapping it opens) up to the limit: a bounded read of an input of 1,000 or 100,000 levels
    assert events[0] <= 2 * MAX_DEPTH + 5
    assert f"nested deeper than {MAX_DEPTH} levels" in str(e) and len(str(e)) < 200
    assert e.line is not None and e.column is not None


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 999, 1001, 100000])
def test_flow_nesting_is_refused_in_dpus_words_whichever_layer_sees_it(depth):
    """A flow collection makes the YAML scanner read ahead to the end of its nesting before the
    first event: from PyYAML 6.0.4 on its libyaml refuses past 1,000 levels itself, before dpu's
    reader sees level 65. The user reads dpu's message either way, with the place of the level
    that was refused; below the scanner's limit that is the '[' opening level 65 (the top mapping
    is level 1), whatever the version."""
    e = error("uplink: " + "[" * depth + "]" * depth + "\n")
    assert re.fullmatch(rf"<string>:1:\d+: nested deeper than {MAX_DEPTH} levels \(a topology needs a handful\)",
                        str(e)), str(e)
    if depth < 1000:
        assert (e.line, e.column) == (1, len("uplink: ") + MAX_DEPTH), str(e)


def test_errors_never_format_a_huge_value():
    huge = "x" * 5_000_000
    for text in (GOOD.replace("ip: 192.0.2.1", f"ip: {huge}"),
                 GOOD.replace("mtu", "x").replace("  ip: 192.0.2.1", f"  ip: 192.0.2.1\n  mtu: {'9' * 6000}"),
                 GOOD.replace("    vni: 100", f"    vni: 100\n    {huge}: 1")):
        e = error(text)
        assert len(str(e)) < 1000, str(e)[:300]
    e = error({"uplink": {"port": "p0", "ip": list(range(10 ** 6)), "mac": "02:00:00:00:00:01"}, "tenants": {}})
    assert len(str(e)) < 1000


# ---- where, and all at once -------------------------------------------------------------------

def test_several_mistakes_are_reported_at_once_with_their_places(tmp_path):
    text = GOOD.replace("mac: 02:00:00:00:00:01", "mac: 02:00:00:00:00:zz").replace(
        "gateway: 10.0.0.1}", "gateway: 10.0.9.1}").replace("ip: 10.0.0.12}", "ip: 10.0.0.300}") + \
        "    colour: blue\n"
    path = write(tmp_path, text)
    e = error(path)
    lines = str(e).splitlines()
    assert lines == [
        f"{path}:4:8: uplink.mac: '02:00:00:00:00:zz' is not a MAC address (xx:xx:xx:xx:xx:xx)",
        f"{path}:11:38: tenants.blue.subnets[0].gateway: 10.0.9.1 is outside its subnet 10.0.0.0/24",
        f"{path}:14:41: tenants.blue.ports.vm2.ip: '10.0.0.300' is not an IP address",
        f"{path}:15:5: tenants.blue.colour: unknown key (expected one of: vni, gateway_mac, subnets, "
        "ports, remote, flood, zone, nat, limits, security_groups)",
    ]
    assert [x.path for x in e.errors] == ["uplink.mac", "tenants.blue.subnets[0].gateway",
                                          "tenants.blue.ports.vm2.ip", "tenants.blue.colour"]
    assert (e.path, e.line, e.column) == ("uplink.mac", 4, 8)
    # a subnet in error does not make every port "outside any subnet"
    assert "not inside any subnet" not in str(e)


def test_a_missing_key_points_at_its_mapping(tmp_path):
    path = write(tmp_path, GOOD.replace("  ip: 192.0.2.1\n", ""))
    e = error(path)
    assert str(e) == f"{path}:1:1: uplink.ip: required"


def test_the_cli_prints_the_places(tmp_path, capsys):
    path = write(tmp_path, GOOD.replace("vni: 100", "vni: '100'").replace("02:00:00:00:01:12", "02:00:00:00:01:11"))
    assert main(["compile", path]) == 1
    err = capsys.readouterr().err
    assert err == (f"dpu: TopologyError: {path}:8:10: tenants.blue.vni: '100' is not an integer\n"
                   f"{path}:14:18: tenants.blue.ports.vm2.mac: 02:00:00:00:01:11 is already used by "
                   "tenants.blue.ports.vm1.mac\n")


def test_dict_input_keeps_its_messages():
    with open(TOPO) as f:
        data = yaml.safe_load(f)
    data["uplink"]["strict_vxlan"] = "false"
    data["tenants"]["red"]["vni"] = 100
    e = error(data)
    assert str(e).splitlines() == [
        "uplink.strict_vxlan: 'false' is not a boolean (write true or false, without quotes)",
        "tenants.red.vni: VNI 100 is already used by tenant blue"]
    assert e.line is None and e.file == "<dict>"


# ---- the file itself ---------------------------------------------------------------------------

def test_not_utf8_is_one_error_naming_the_place(tmp_path, capsys):
    path = write(tmp_path, GOOD.encode().replace(b"port: p0", b"port: p\xe90"))
    e = error(path)
    assert str(e) == f"{path}:2:10: not UTF-8 text (byte 0xe9): save the file as UTF-8"
    assert main(["compile", path]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"dpu: TopologyError: {path}:2:10: not UTF-8")


def test_utf8_bom_is_accepted(tmp_path):
    path = write(tmp_path, b"\xef\xbb\xbf" + GOOD.encode())
    topo = load_topology(path)
    assert topo.uplink.port == "p0" and list(topo.tenants) == ["blue"]
    # and places count from the first character after it
    e = error(write(tmp_path, b"\xef\xbb\xbf" + GOOD.replace("port: p0", "port: '#'").encode()))
    assert (e.line, e.column) == (2, 9)


def test_a_directory_or_a_missing_file_is_one_line(tmp_path, capsys):
    assert str(error(str(tmp_path))) == f"{tmp_path}: is a directory, not a topology file"
    missing = str(tmp_path / "missing.yaml")
    assert str(error(missing)) == f"{missing}: no such topology file"
    assert str(error("missing:file.yaml")) == "missing:file.yaml: no such topology file"
    for arg in (str(tmp_path), missing, "missing:file.yaml"):
        assert main(["compile", arg]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("dpu: ") and arg in err and "Traceback" not in err


def test_other_yaml_that_a_topology_never_needs(tmp_path):
    cases = {
        "a: 1\n---\nb: 2\n": "<string>:2:1: a second YAML document: a topology file holds one",
        "uplink: !!python/object:os.system {}\n": "not supported in a topology file",
        "uplink:\n  <<: {port: p0}\n": "<string>:2:3: YAML merge keys (<<) are not supported",
        "? [a, b]\n: 1\n": "<string>:1:3: a mapping key must be a plain value",
        "uplink: [\n  port: p0\n": "<string>:3:1: invalid YAML: ",
        "uplink:\n  port: p\x010\n": "<string>:2:10: invalid YAML: control characters are not allowed",
        "uplink:\n  mtu: 2001-13-01\n": "<string>:2:8: cannot read '2001-13-01' as a YAML timestamp",
        "just text\nand more\n": "<string>:1:1: expected a mapping (uplink:, tenants:), got str",
    }
    for text, words in cases.items():
        assert words in str(error(text)), text


# ---- fuzz: anything either loads or is a TopologyError ------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from helpers.fuzzing import bounded, edited  # noqa: E402
SEEDS = [open(TOPO).read(), open(NAT_TOPO).read(), GOOD]
PIECES = ["\n", "  ", "    ", ": ", "- ", "-", ":", ",", "[", "]", "{", "}", "&a ", "*a", "!!str ", "!!int ", "!x ",
          "<<: ", "? ", "'", '"', "#", "|", ">", "---\n", "...\n", "~", "null", "true", "'false'", "yes", "0x1f",
          "1e9", "99999999999999999999", "12:34:56:00:00:01", "10.0.0.1", "10.0.0.0/24", "2001:db8::1", "vm1",
          "blue", "tenants", "uplink", "ports", "subnets", "nat", "snat", "\t", "\x00", "\ufeff", "é", "\u2028"]
KEYS = ["uplink", "tenants", "internet", "conntrack", "port", "ip", "mac", "nexthop_mac", "nexthop", "mtu",
        "strict_vxlan", "src_port_range", "vni", "gateway_mac", "subnets", "cidr", "gateway", "ports", "remote",
        "vtep", "flood", "zone", "nat", "snat", "floating", "forwards", "private", "public", "proto", "to",
        "to_port", "filtering", "limits", "connections", "timeouts", "udp", "blue", "vm1"]
scalars = (st.none() | st.booleans() | st.integers(-2, 1 << 70) | st.floats(allow_nan=True)
           | st.sampled_from(PIECES + KEYS) | st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), inner, max_size=4),
                      max_leaves=20)


@st.composite
def topology_text(draw):
    kind = draw(st.integers(0, 3))
    if kind == 0:  # a good file, changed a little
        return edited(draw, draw(st.sampled_from(SEEDS)), PIECES, edits=5, cut=12)
    if kind == 1:  # a good topology with one value replaced, as YAML
        data = yaml.safe_load(draw(st.sampled_from(SEEDS)))
        node = data
        for _ in range(draw(st.integers(1, 6))):
            if isinstance(node, dict) and node:
                key = draw(st.sampled_from(sorted(node, key=str)))
            elif isinstance(node, list) and node:
                key = draw(st.integers(0, len(node) - 1))
            else:
                break
            if not isinstance(node[key], (dict, list)) or draw(st.booleans()):
                node[key] = draw(values)
                break
            node = node[key]
        return yaml.safe_dump(data, default_flow_style=draw(st.sampled_from([None, True, False])))
    if kind == 2:  # YAML-shaped soup
        return "".join(draw(st.lists(st.sampled_from(PIECES), max_size=40)))
    return draw(st.text(max_size=200))


def loads_or_topology_error(src):
    try:
        load_topology(src)
    except TopologyError as e:
        text = str(e)
        assert text and len(text) < 200 * 1000
        return e
    return None


@bounded(250)
@given(topology_text())
def test_fuzz_text_loads_or_is_a_topology_error(text):
    e = loads_or_topology_error(text if ("\n" in text or text.lstrip().startswith("{")) else text + "\n")
    if e is not None:
        for line in str(e).splitlines():
            assert re.match(r"<string>(:\d+:\d+)?: ", line), line


@bounded(100)
@given(st.binary(max_size=200) | topology_text().map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_fuzz_files_load_or_are_a_topology_error(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("fuzz") / "t.yaml"
    path.write_bytes(raw)
    e = loads_or_topology_error(str(path))
    if e is not None:
        assert all(line.startswith(str(path) + ":") for line in str(e).splitlines()), str(e)


@bounded(150)
@given(values)
def test_fuzz_python_values_load_or_are_a_topology_error(data):
    loads_or_topology_error(data if isinstance(data, dict) else {"uplink": data, "tenants": data})
