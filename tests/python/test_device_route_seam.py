"""The device route sees its communicator only through the public RouteContext
(commlib/device/route_context.py): neither the route nor the NCCL set-up reads a private
attribute of another object (issue #26: the route was a private peer of Communicator)."""
import ast
import os

from commlib.device.route_context import RouteContext

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEAM_USERS = ("commlib/core/device_route.py", "commlib/device/nccl_comm.py")


def communicator_privates():
    """Every `self._x` the Communicator class assigns: its private state."""
    path = os.path.join(ROOT, "commlib/core/communicator.py")
    names = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr.startswith("_") \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return names


def private_reads(path, privates):
    """`x._name` for one of the communicator's privates, where x is not `self`."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read(), path)
    return [f"{path}:{node.lineno}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in privates
            and isinstance(node.value, ast.Name) and node.value.id != "self"]


def test_the_device_route_reads_no_private_state():
    privates = communicator_privates()
    assert {"_core", "_store", "_prefix"} <= privates  # the scanner sees them
    found = [hit for p in SEAM_USERS for hit in private_reads(p, privates)]
    assert not found, "\n".join(found)


def test_the_communicator_hands_the_route_its_context():
    import commlib
    from commlib.bootstrap.store import StoreServer, TCPStore
    s = StoreServer("127.0.0.1", 0)
    try:
        comm = commlib.init(rank=0, world_size=1, store=TCPStore("127.0.0.1", s.port), prefix="seam")
        ctx = comm._device()._ctx
        assert isinstance(ctx, RouteContext)
        assert (ctx.rank, ctx.size, ctx.timeout) == (comm.rank, comm.size, comm.timeout)
        assert len(ctx.core.host_of) == 1
        comm.close()
    finally:
        s.close()
