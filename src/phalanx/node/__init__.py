"""What runs on each node: topology discovery (NVML, sysfs) and GPU-share reservations.

It talks to the hardware and to the API server (through lightkube's client, directly), never
to the scheduler: what it publishes is the `phalanx.io/device-topology` node annotation and
the reservation pod's `phalanx.io/reserved-gpu` annotation, both documented in
`docs/kubernetes.md`.
"""
