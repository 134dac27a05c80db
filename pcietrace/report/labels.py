"""Words for the result tables' codes, shared by the renderers that show them (console, plots)."""

from __future__ import annotations

#: What each latency test measured, as the latency table and plot name it.
LATENCY_LABELS = {
    "host_read_rtt": "host memory read round trip (chase, 64 KiB)",
    "host_read_rtt_2mib": "host memory read round trip (chase, 2 MiB)", "device_read_l2": "device memory chase, 2 MiB (L2)",
    "device_read_hbm": "device memory chase, 256 MiB (HBM)", "peer_read_rtt": "peer GPU memory read round trip",
    "copy_h2d_4B": "4 B copy H2D + sync", "copy_d2h_4B": "4 B copy D2H + sync",
    "launch_sync_eager": "launch + synchronize, eager", "launch_sync_graph1": "launch + synchronize, graph of 1",
    "launch_to_first_instruction": "launch -> first instruction seen by host",
    "kernel_end_to_host": "kernel's last store seen -> stream reported done"}
