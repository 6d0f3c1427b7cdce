// LD_PRELOAD shim for scripts/sdpa_oracle/oracle.py: makes libtorch_cuda believe that one CUDA
// device is present, with the compute capability in BLINK_FAKE_SM ("9.0") and the runtime cuDNN
// version in BLINK_FAKE_CUDNN ("91900"), so that torch's own sdp::select_sdp_backend can be run
// on a machine without a GPU. Only the functions that the SDPA checks call are replaced.
//
//   gcc -shared -fPIC -O2 -o libfakecuda.so fakecuda.c
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// cudaDeviceProp is large; major and minor sit at byte offsets 0x168 and 0x16c (CUDA 12/13).
static unsigned char props[8192];
static int props_ready = 0;

static void init_props(void) {
  if (props_ready) return;
  props_ready = 1;
  memset(props, 0, sizeof(props));
  int major = 9, minor = 0;
  const char* sm = getenv("BLINK_FAKE_SM");
  if (sm) sscanf(sm, "%d.%d", &major, &minor);
  memcpy(props + 0x168, &major, sizeof(int));
  memcpy(props + 0x16c, &minor, sizeof(int));
}

// at::cuda::getCurrentDeviceProperties()
void* _ZN2at4cuda26getCurrentDevicePropertiesEv(void) {
  init_props();
  return props;
}

// at::cuda::getDeviceProperties(c10::DeviceIndex)
void* _ZN2at4cuda19getDevicePropertiesEa(signed char device) {
  (void)device;
  init_props();
  return props;
}

// c10::cuda::device_count()
signed char _ZN3c104cuda12device_countEv(void) { return 1; }

// c10::cuda::current_device()
signed char _ZN3c104cuda14current_deviceEv(void) { return 0; }

// cudnnGetVersion(), read by at::detail::getCUDAHooks().versionRuntimeCuDNN()
size_t cudnnGetVersion(void) {
  const char* version = getenv("BLINK_FAKE_CUDNN");
  return version ? (size_t)atol(version) : 92400;
}
