"""What a fault's `target` may name: a node (node0, ...), or a role resolved when the fault fires."""

ETCD = "etcd"  # the etcd container's node name
ROLE_TARGETS = ("random", "store-host", "rank0", ETCD)
