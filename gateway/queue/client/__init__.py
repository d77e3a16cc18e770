"""Redis clients as tiergate uses them: standalone, Sentinel or Cluster, and typed views of stream
replies."""
