"""Generates C++ protobuf and gRPC code with the system protoc."""

def cc_grpc_proto(name, src, deps = [], visibility = None):
    """A cc_library of the messages and gRPC stubs of `src`.

    Args:
      name: the library's name.
      src: the .proto file.
      deps: other cc_grpc_proto libraries it imports.
      visibility: the library's visibility (the generator stays private).
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc", base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = outs,
        visibility = ["//visibility:private"],
        cmd = ("protoc --proto_path=. --cpp_out=$(GENDIR) --grpc_out=$(GENDIR) " +
               "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin $(SRCS)"),
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc", base + ".grpc.pb.cc"],
        hdrs = [base + ".pb.h", base + ".grpc.pb.h"],
        deps = deps + ["//third_party/system:grpc", "//third_party/system:protobuf"],
        visibility = visibility,
    )
