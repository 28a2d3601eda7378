"""Kubelet's device-plugin API (package `v1beta1`), described in Python rather than generated.

The messages and field numbers are kubelet's wire contract (k8s.io/kubelet
pkg/apis/deviceplugin/v1beta1); building the descriptor here keeps protoc and generated
files out of the build. gRPC calls go through generic handlers with these classes'
serializers.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "v1beta1"
VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"

F = descriptor_pb2.FieldDescriptorProto
_SCALAR = {"string": F.TYPE_STRING, "bool": F.TYPE_BOOL, "int64": F.TYPE_INT64, "int32": F.TYPE_INT32}

# message -> [(field, number, type, repeated)]; a type that is not a scalar names a message
MESSAGES: dict[str, list[tuple[str, int, str, bool]]] = {
    "Empty": [],
    "DevicePluginOptions": [
        ("pre_start_required", 1, "bool", False),
        ("get_preferred_allocation_available", 2, "bool", False),
    ],
    "RegisterRequest": [
        ("version", 1, "string", False),
        ("endpoint", 2, "string", False),
        ("resource_name", 3, "string", False),
        ("options", 4, "DevicePluginOptions", False),
    ],
    "NUMANode": [("ID", 1, "int64", False)],
    "TopologyInfo": [("nodes", 1, "NUMANode", True)],
    "Device": [
        ("ID", 1, "string", False),
        ("health", 2, "string", False),
        ("topology", 3, "TopologyInfo", False),
    ],
    "ListAndWatchResponse": [("devices", 1, "Device", True)],
    "PreStartContainerRequest": [("devices_ids", 1, "string", True)],
    "PreStartContainerResponse": [],
    "ContainerPreferredAllocationRequest": [
        ("available_deviceIDs", 1, "string", True),
        ("must_include_deviceIDs", 2, "string", True),
        ("allocation_size", 3, "int32", False),
    ],
    "PreferredAllocationRequest": [("container_requests", 1, "ContainerPreferredAllocationRequest", True)],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1, "string", True)],
    "PreferredAllocationResponse": [("container_responses", 1, "ContainerPreferredAllocationResponse", True)],
    "ContainerAllocateRequest": [("devices_ids", 1, "string", True)],
    "AllocateRequest": [("container_requests", 1, "ContainerAllocateRequest", True)],
    "CDIDevice": [("name", 1, "string", False)],
    "Mount": [
        ("container_path", 1, "string", False),
        ("host_path", 2, "string", False),
        ("read_only", 3, "bool", False),
    ],
    "DeviceSpec": [
        ("container_path", 1, "string", False),
        ("host_path", 2, "string", False),
        ("permissions", 3, "string", False),
    ],
    "ContainerAllocateResponse": [
        ("envs", 1, "map", True),
        ("mounts", 2, "Mount", True),
        ("devices", 3, "DeviceSpec", True),
        ("annotations", 4, "map", True),
        ("cdi_devices", 5, "CDIDevice", True),
    ],
    "AllocateResponse": [("container_responses", 1, "ContainerAllocateResponse", True)],
}

# service -> {method: (request, response, server streaming)}
SERVICES: dict[str, dict[str, tuple[str, str, bool]]] = {
    "Registration": {"Register": ("RegisterRequest", "Empty", False)},
    "DevicePlugin": {
        "GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
        "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
        "GetPreferredAllocation": ("PreferredAllocationRequest", "PreferredAllocationResponse", False),
        "Allocate": ("AllocateRequest", "AllocateResponse", False),
        "PreStartContainer": ("PreStartContainerRequest", "PreStartContainerResponse", False),
    },
}


Fields = dict[str, list[tuple[str, int, str, bool]]]
Services = dict[str, dict[str, tuple[str, str, bool]]]


def _file(
    name: str, package: str, messages: Fields, services: Services
) -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax="proto3")
    for mname, fields in messages.items():
        m = f.message_type.add(name=mname)
        for fname, num, typ, repeated in fields:
            fd = m.field.add(name=fname, number=num, label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if typ == "map":  # map<string, string>: a nested entry message
                entry = m.nested_type.add(name=f"{fname.title().replace('_', '')}Entry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, label=F.LABEL_OPTIONAL, type=F.TYPE_STRING)
                entry.field.add(name="value", number=2, label=F.LABEL_OPTIONAL, type=F.TYPE_STRING)
                fd.type = F.TYPE_MESSAGE
                fd.type_name = f".{package}.{mname}.{entry.name}"
            elif typ in _SCALAR:
                fd.type = _SCALAR[typ]
            else:
                fd.type = F.TYPE_MESSAGE
                fd.type_name = f".{package}.{typ}"
    for sname, methods in services.items():
        s = f.service.add(name=sname)
        for method, (req, resp, stream) in methods.items():
            s.method.add(
                name=method,
                input_type=f".{package}.{req}",
                output_type=f".{package}.{resp}",
                server_streaming=stream,
            )
    return f


def build(name: str, package: str, messages: Fields, services: Services) -> dict[str, Any]:
    """Message classes for a kubelet gRPC API described as `messages` and `services`."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file(name, package, messages, services))
    return {
        m: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{m}")) for m in messages
    }


M: dict[str, Any] = build("phalanx_deviceplugin_v1beta1.proto", PACKAGE, MESSAGES, SERVICES)


def path(service: str, method: str) -> str:
    return f"/{PACKAGE}.{service}/{method}"
