"""The cluster-admin methods of a node's gRPC service (a mixin of
``MessageLogService``): asked of a group's leader by the controller
(``GroupInfo``, ``ChangeReplicas``, ``TransferLeader``), of a node
(``DropReplica``), of the metadata leader by a joining node (``JoinCluster``)
and by ``rmq cluster`` (``ClusterCommand``)."""
from __future__ import annotations

from ..proto import rmq_pb2
from ..protocol.errors import invalid
from .guard import _guard
from .validate import check_data_group, check_node_address

__all__ = ["ClusterAdmin"]


class ClusterAdmin:

    @_guard
    def GroupInfo(self, request, context):
        check_data_group(self.node, request.group, meta_ok=True)
        return self.node.group_info(request.group)

    @_guard
    def ChangeReplicas(self, request, context):
        check_data_group(self.node, request.group, meta_ok=True)
        if bool(request.add) == bool(request.remove):
            raise invalid("give one of add or remove (a node's address), not both")
        check_node_address(request.add or request.remove)
        return rmq_pb2.ChangeReplicasResponse(
            replicas=self.node.change_replicas(request.group, request.add, request.remove))

    @_guard
    def TransferLeader(self, request, context):
        check_data_group(self.node, request.group, meta_ok=True)
        check_node_address(request.to)
        return rmq_pb2.TransferLeaderResponse(leader=self.node.transfer_leader(request.group, request.to))

    @_guard
    def DropReplica(self, request, context):
        check_data_group(self.node, request.group)
        return rmq_pb2.DropReplicaResponse(dropped=self.node.drop_replica(request.group))

    @_guard
    def JoinCluster(self, request, context):
        check_node_address(request.address)
        members, index = self.node.join(request.address)
        return rmq_pb2.JoinClusterResponse(members=members, groups=self.node.config.groups, members_index=index)

    @_guard
    def ClusterCommand(self, request, context):
        return rmq_pb2.ClusterCommandResponse(message=self.node.cluster_command(
            request.action, request.node, request.group, request.to, request.ignore_racks))

