"""Generated gRPC stubs of the wire contract (package ``chopper.v1``)."""
