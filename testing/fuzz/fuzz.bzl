"""libFuzzer targets that are also regression tests.

    load("//testing/fuzz:fuzz.bzl", "cc_fuzz_test")
    cc_fuzz_test(
        name = "libsvm_fuzzer",
        srcs = ["libsvm_fuzzer.cc"],   # defines LLVMFuzzerTestOneInput
        deps = [":dataset"],
    )

The corpus lives in testdata/fuzz/<name>/ of the package: seeds, and every
input that once made the target fail (kept, so that it cannot come back).

 - In a normal build (and under --config=asan or tsan), `name` is a cc_test
   that runs each corpus file through LLVMFuzzerTestOneInput once
   (testing/fuzz/replay_main.cc): `bazel test //...` replays every corpus.
 - Built with --config=fuzz (clang, libFuzzer, ASan + UBSan), it is a
   libFuzzer binary: tools/fuzz.sh runs each target for a bounded time.

Tagged "fuzz_target", so that tools/fuzz.sh finds them all with
`bazel query 'attr(tags, fuzz_target, //...)'`.
"""

def cc_fuzz_test(name, srcs, deps = [], data = [], size = "small", **kwargs):
    corpus = "testdata/fuzz/" + name
    native.cc_test(
        name = name,
        srcs = srcs,
        size = size,
        deps = deps + select({
            "//testing/fuzz:fuzzing": ["//testing/fuzz:libfuzzer_main"],
            "//conditions:default": ["//testing/fuzz:replay_main"],
        }),
        data = data + native.glob([corpus + "/**"]),
        args = [native.package_name() + "/" + corpus],
        tags = kwargs.pop("tags", []) + ["fuzz_target"],
        **kwargs
    )
