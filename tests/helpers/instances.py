"""A real dpu.live.Instance attached to no interface: what the control and metrics servers
serve in the tests that exercise them (test_control_robust), in the test process or in a
child process of their own."""
from dpu.dataplane import Dataplane
from dpu.live import Instance, LiveOptions

FLOWS = "table=0,priority=10,in_port=p1,actions=output:p2\ntable=0,priority=10,in_port=p2,actions=output:p1\n"


def unattached_instance(tmp_path) -> Instance:
    """A real Instance and Dataplane (ports p1 and p2, two flows), attached to no interface."""
    flows = tmp_path / "fwd.flows"
    flows.write_text(FLOWS)
    inst = Instance(LiveOptions(ports=[("p1", "none1"), ("p2", "none2")], flows=str(flows)))
    dp = Dataplane()
    with dp.transaction() as t:
        t.add_port("p1")
        t.add_port("p2")
    dp.load_flows(str(flows))
    inst.dp = dp
    return inst
