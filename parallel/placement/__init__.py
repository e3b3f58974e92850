"""Where things go: the device inventory (NVML/torch, visible devices), device strings and member
names, sizing of weights and headroom, and the planner that assigns blocks to devices (its types,
ranges and text)."""
