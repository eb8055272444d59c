"""The wire side: generated protobuf/gRPC code (``gen``) and conversions to devplug's value types.

Only the engine, the dev kubelet and this package import the generated code.
"""
