// Every C++ candidate of the soak and of the CPU tests: one source, one build per user (each binds
// the functions it needs), shared by all of that user's candidates through the compile cache.
// Correct: relu_fwd, scaled_relu, relu_slow, chain. Wrong: leaky_wrong, relu_inplace, zeros,
// copy_fwd, gelu_wrong. Faults: crash, spin, hog, oob_write; chatty and forker are correct but noisy.
#include <torch/extension.h>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <unistd.h>

torch::Tensor relu_fwd(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* a = xc.data_ptr<float>();
    float* b = y.data_ptr<float>();
    const int64_t n = xc.numel();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) b[i] = a[i] > 0.f ? a[i] : 0.f;
    return y;
}

torch::Tensor scaled_relu(torch::Tensor x, double scale) {
    auto y = relu_fwd(x);
    float* b = y.data_ptr<float>();
    for (int64_t i = 0; i < y.numel(); ++i) b[i] = b[i] * (float)scale;
    return y;
}

// A correct but slow ReLU: `reps` passes over the data, so that skipped work shows in its time.
torch::Tensor relu_slow(torch::Tensor x, int64_t reps) {
    auto y = relu_fwd(x);
    float* b = y.data_ptr<float>();
    const float* a = x.contiguous().data_ptr<float>();
    for (int64_t r = 1; r < reps; ++r) {
        for (int64_t i = 0; i < y.numel(); ++i) {
            volatile float v = a[i] > 0.f ? a[i] : 0.f;
            b[i] = v;
        }
    }
    return y;
}

// Wrong on purpose: negatives leak through at half strength.
torch::Tensor leaky_wrong(torch::Tensor x) {
    auto y = torch::empty_like(x);
    const float* a = x.data_ptr<float>();
    float* b = y.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) b[i] = a[i] > 0.f ? a[i] : 0.5f * a[i];
    return y;
}

torch::Tensor relu_inplace(torch::Tensor x) {
    float* a = x.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) a[i] = a[i] > 0.f ? a[i] : 0.f;
    return x;
}

torch::Tensor zeros(torch::Tensor x) {
    auto y = torch::empty_like(x);
    float* b = y.data_ptr<float>();
    for (int64_t i = 0; i < y.numel(); ++i) b[i] = 0.f;
    return y;
}

void touch(torch::Tensor x) { (void)x.numel(); }

// The identity, into a new tensor: a "ReLU" that is only right on non-negative inputs.
torch::Tensor copy_fwd(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    std::memcpy(y.data_ptr<float>(), xc.data_ptr<float>(), xc.numel() * sizeof(float));
    return y;
}

torch::Tensor crash(torch::Tensor x) {
    volatile float* p = nullptr;
    *p = 1.f;
    return x;
}

torch::Tensor spin(torch::Tensor x) {
    volatile bool forever = true;
    while (forever) {}
    return x;
}

torch::Tensor hog(torch::Tensor x) {
    // Grabs and touches memory until the allocation fails or the watchdog ends the worker.
    // Kept where the optimiser cannot prove them unused (clang elides a new/memset pair otherwise).
    static char* volatile kept[4096];
    for (int i = 0; i < 4096; ++i) {
        char* block = new char[1ull << 28];
        std::memset(block, 1, 1ull << 28);
        kept[i] = block;
    }
    return x;
}

torch::Tensor oob_write(torch::Tensor x) {
    // Writes far past the end of its output: always unmapped, so always a fault, never silent.
    auto y = torch::empty_like(x);
    float* b = y.data_ptr<float>();
    volatile int64_t far = int64_t(1) << 40;
    b[y.numel() + far] = 1.f;
    return y;
}

torch::Tensor chatty(torch::Tensor x) {
    // Correct, but prints 512 KB to stdout on every call (megabytes per evaluation).
    static char line[1024];
    std::memset(line, 'x', sizeof(line) - 1);
    line[sizeof(line) - 1] = '\n';
    for (int i = 0; i < 512; ++i) std::fwrite(line, 1, sizeof(line), stdout);
    std::fflush(stdout);
    return relu_slow(x, 2);
}

torch::Tensor forker(torch::Tensor x) {
    // Correct, but forks once per process: the child lingers 30 s, then exits by itself.
    static bool forked = false;
    if (!forked) {
        forked = true;
        if (fork() == 0) {
            sleep(30);
            _exit(0);
        }
    }
    return relu_slow(x, 2);
}

// Level 2, 9_bias_tanh_clamp_chain: one pass instead of five; clearly faster than eager.
torch::Tensor chain(torch::Tensor x, torch::Tensor scale, torch::Tensor shift, double low, double high) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t n = xc.size(0), c = xc.size(1), hw = xc.size(2) * xc.size(3);
    const float* in = xc.data_ptr<float>();
    const float* sc = scale.contiguous().data_ptr<float>();
    const float* sh = shift.contiguous().data_ptr<float>();
    float* o = out.data_ptr<float>();
    const float lo = (float)low, hi = (float)high;
    #pragma omp parallel for collapse(2)
    for (int64_t b = 0; b < n; ++b) {
        for (int64_t ch = 0; ch < c; ++ch) {
            const int64_t base = (b * c + ch) * hw;
            const float s = sc[ch], t = sh[ch];
            #pragma omp simd
            for (int64_t i = 0; i < hw; ++i) {
                float v = in[base + i];
                float y = tanhf(v * s + t);
                y = y < lo ? lo : (y > hi ? hi : y);
                o[base + i] = y * v;
            }
        }
    }
    return out;
}

// Level 1, 2_gelu: wrong on purpose (the tanh approximation's constant is off).
torch::Tensor gelu_wrong(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* a = xc.data_ptr<float>();
    float* b = y.data_ptr<float>();
    const int64_t n = xc.numel();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) {
        float v = a[i];
        b[i] = 0.5f * v * (1.f + tanhf(0.9f * (v + 0.044715f * v * v * v)));
    }
    return y;
}
