"""Helpers shared by the DCGM and models polling-source tests (a real HTTP server)."""

from __future__ import annotations

DCGM_PAGE = """# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",pod="vllm-a"} 35
DCGM_FI_DEV_GPU_UTIL{gpu="1",pod="vllm-a"} 91
DCGM_FI_DEV_GPU_UTIL{gpu="2",pod="vllm-b"} 20
DCGM_FI_DEV_FB_USED{gpu="0",pod="vllm-a"} 1000
"""


CONFIG = """
plugins:
- {type: dcgm-data-source, name: dcgm, parameters: {port: PORT, useNodeAddress: true, interval: 20ms}}
- {type: dcgm-extractor}
- {type: models-data-source, parameters: {interval: 1s}}
- {type: models-data-extractor}
- type: endpoint-attribute-filter
  parameters:
    attribute: GPUUtilization
    producer: dcgm-extractor
    algorithm: {type: threshold, threshold: {operator: LessThanOrEqual, value: 0.9}}
dataLayer:
  sources:
  - {pluginRef: dcgm, extractors: [{pluginRef: dcgm-extractor}]}
  - {pluginRef: models-data-source, extractors: [{pluginRef: models-data-extractor}]}
"""
