"""Flow-control policies (flowControl.priorityBands / usageLimitPolicyPluginRef)."""
