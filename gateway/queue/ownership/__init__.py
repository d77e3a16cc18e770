"""Job ownership: who answers and books a request (the table in ``table``), and the edge booking
what a handed-back job noted; the Redis steps of each transition: claims, run notes, cancels,
reclaims."""
