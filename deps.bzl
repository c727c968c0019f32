"""drpc_deps(): what a workspace that depends on drpc declares, all offline.

In the dependent workspace's WORKSPACE:

    local_repository(name = "drpc", path = "/path/to/drpc")
    load("@drpc//:deps.bzl", "drpc_deps")
    drpc_deps()

and in its .bazelrc (Bazel 4.2.3's auto-configured toolchain passes -std=c++0x first; only
a flag can come after it, no target can propagate one):

    build --cxxopt=-std=c++17 --host_cxxopt=-std=c++17

It declares the shims Bazel 4.2.3 would otherwise download (@rules_cc, @rules_java,
@remote_coverage_tools: the same re-exports of native rules and coverage stubs as drpc's own
third_party/), @platforms from Debian's bazel-platforms, and @drpc_torch_api, the headers of
libtorch's C++ front end (/usr/include/torch/csrc/api/include), which //third_party:torch
puts on its dependents' include path. Repositories the workspace already declares are kept.
"""

def _shim_impl(ctx):
    for path, content in ctx.attr.files.items():
        ctx.file(path, content, executable = path.endswith(".sh"))

_shim = repository_rule(
    implementation = _shim_impl,
    attrs = {"files": attr.string_dict()},
    local = True,
)

_RULES_CC_DEFS = """# Offline shim: re-exports Bazel 4.2.3's native C++ rules (Debian's bazel-rules-cc is too new).
cc_library = native.cc_library
cc_binary = native.cc_binary
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
cc_import = native.cc_import
cc_proto_library = native.cc_proto_library
"""

_RULES_JAVA_DEFS = """# Offline shim: re-exports Bazel 4.2.3's native Java rules.
java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_runtime = native.java_runtime
java_toolchain = native.java_toolchain
"""

_COVERAGE_BUILD = """# `bazel test` resolves these two targets even without coverage; offline they are stubs.
sh_binary(name = "coverage_report_generator", srcs = ["unavailable.sh"], visibility = ["//visibility:public"])
sh_binary(name = "lcov_merger", srcs = ["unavailable.sh"], visibility = ["//visibility:public"])
"""

_TORCH_API_BUILD = """# libtorch's C++ front end (torch/optim, torch/nn, ...), from Debian's libtorch-dev.
cc_library(
    name = "headers",
    hdrs = glob(["**/*.h"]),
    includes = ["."],
    visibility = ["//visibility:public"],
)
"""

def drpc_deps():
    """Declares the repositories drpc needs in a dependent workspace (see the file's doc)."""
    existing = native.existing_rules()
    if "rules_cc" not in existing:
        _shim(name = "rules_cc", files = {
            "WORKSPACE": 'workspace(name = "rules_cc")\n',
            "BUILD": "",
            "cc/BUILD": "",
            "cc/defs.bzl": _RULES_CC_DEFS,
        })
    if "rules_java" not in existing:
        _shim(name = "rules_java", files = {
            "WORKSPACE": 'workspace(name = "rules_java")\n',
            "BUILD": "",
            "java/BUILD": "",
            "java/defs.bzl": _RULES_JAVA_DEFS,
        })
    if "remote_coverage_tools" not in existing:
        _shim(name = "remote_coverage_tools", files = {
            "WORKSPACE": 'workspace(name = "remote_coverage_tools")\n',
            "BUILD": _COVERAGE_BUILD,
            "unavailable.sh": '#!/usr/bin/env bash\necho "coverage is not available offline" >&2\nexit 1\n',
        })
    if "platforms" not in existing:
        native.local_repository(name = "platforms", path = "/usr/share/bazel/platforms")
    if "drpc_torch_api" not in existing:
        native.new_local_repository(
            name = "drpc_torch_api",
            path = "/usr/include/torch/csrc/api/include",
            build_file_content = _TORCH_API_BUILD,
        )
