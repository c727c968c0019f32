"""C++ protobuf and gRPC stubs from the system protoc (Debian's), without @com_google_protobuf."""

def cc_proto(name, src, grpc = False, deps = [], visibility = None):
    """Turns `src` (a .proto in this package) into a cc_library `name`.

    Args:
      name: the cc_library to create.
      src: the .proto file, in the calling package.
      grpc: also generate gRPC service stubs (.grpc.pb.h/.cc).
      deps: other cc_proto targets whose messages `src` imports.
      visibility: visibility of the cc_library.
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    pkg = native.package_name()

    # Paths are relative to the repository's root: "." when drpc is the main repository,
    # external/drpc (its generated files under $(GENDIR)/external/drpc) when another
    # workspace depends on it.
    repo = native.repository_name().lstrip("@")
    root = "external/" + repo if repo else "."
    out = "$(GENDIR)/" + root if repo else "$(GENDIR)"
    cmd = "protoc --proto_path=" + root + " --cpp_out=" + out + " "
    if grpc:
        cmd += "--grpc_out=" + out + " --plugin=protoc-gen-grpc=$$(which grpc_cpp_plugin) "
    cmd += (root + "/" if repo else "") + (pkg + "/" if pkg else "") + src
    native.genrule(
        name = name + "_gen",
        srcs = [src] + [d + "_srcs" for d in deps],
        outs = outs,
        cmd = cmd,
        visibility = ["//visibility:private"],
    )
    native.filegroup(
        name = name + "_srcs",
        srcs = [src],
        visibility = visibility,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["//third_party:protobuf"] + (["//third_party:grpc"] if grpc else []),
        visibility = visibility,
    )
