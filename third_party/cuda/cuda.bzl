"""Builds CUDA sources with nvcc where @local_cuda found it.

    load("//third_party/cuda:cuda.bzl", "cuda_library")
    cuda_library(name = "kernels", srcs = ["k.cu"], hdrs = ["k.h"])

With CUDA, each .cu file becomes an object (nvcc -c, position independent,
for the architectures in @local_cuda//:defs.bzl), the objects a static
library, and `name` a cc_library over it that links cudart and cuBLAS and
defines DOWNPOUR_HAVE_CUDA=1 for its dependents. Without CUDA, `name` is a
cc_library of the headers alone and the .cu files are not compiled, so code
that depends on it builds everywhere and checks DOWNPOUR_HAVE_CUDA.

The .cu files may include workspace headers by their full path
("models/cuda/internal/x.h"); list those in hdrs. nvcc runs outside Bazel's
C++ toolchain: keep the .cu files free of other libraries' headers.
"""

load("@local_cuda//:defs.bzl", "CUDA_ARCHS", "CUDA_ENABLED", "NVCC")

def if_cuda(if_true, if_false = []):
    """if_true where CUDA is built, else if_false."""
    return if_true if CUDA_ENABLED else if_false

def cuda_library(name, srcs, hdrs = [], deps = [], nvcc_flags = [], **kwargs):
    if not CUDA_ENABLED:
        native.cc_library(name = name, hdrs = hdrs, deps = deps, **kwargs)
        return
    lib = "lib%s_cu.a" % name
    flags = [
        "-std=c++17",
        "-O2",
        "-ccbin=/usr/bin/gcc",
        "-Xcompiler=-fPIC",
        "-I.",
    ] + CUDA_ARCHS + nvcc_flags
    compile = " && ".join([
        "%s %s -c $(location %s) -o $(@D)/_%s_%d.o" % (NVCC, " ".join(flags), s, name, i)
        for i, s in enumerate(srcs)
    ])
    objs = " ".join(["$(@D)/_%s_%d.o" % (name, i) for i in range(len(srcs))])
    native.genrule(
        name = name + "_nvcc",
        srcs = srcs + hdrs,
        outs = [lib],
        cmd = "%s && ar rcs $@ %s && rm -f %s" % (compile, objs, objs),
        message = "nvcc %s" % name,
    )
    native.cc_library(
        name = name,
        srcs = [":" + lib],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda"],
        **kwargs
    )
