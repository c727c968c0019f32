"""One libFuzzer target: its library, its regression test and its fuzzing binary."""

def fuzz_target(name, srcs, deps, size = "small"):
    """Declares `name` (a cc_library defining LLVMFuzzerTestOneInput) and beside it

      name_test: replays corpus/<target>/ and crashers/<target>/ through the library with
          the normal compiler (runs in CI with every other test);
      name_bin: the libFuzzer binary, built only by tools/fuzz.sh (clang, sanitizers).

    Args:
      name: "<target>_fuzzer"; <target> names the corpus and crasher directories.
      srcs: the fuzz target's sources.
      deps: what they use.
      size: the regression test's size.
    """
    target = name[:-len("_fuzzer")]
    native.cc_library(
        name = name,
        testonly = True,
        srcs = srcs,
        deps = deps + [":check"],
        alwayslink = True,
    )
    native.filegroup(
        name = target + "_inputs",
        srcs = native.glob(["corpus/%s/*" % target, "crashers/%s/*" % target]),
    )
    native.cc_test(
        name = name + "_test",
        size = size,
        srcs = ["regression_test.cc"],
        args = [target, "$(rootpaths :%s_inputs)" % target],
        data = [":%s_inputs" % target],
        deps = [
            ":" + name,
            "//third_party:gtest",
        ],
    )
    native.cc_binary(
        name = name + "_bin",
        testonly = True,
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        deps = [":" + name],
    )
