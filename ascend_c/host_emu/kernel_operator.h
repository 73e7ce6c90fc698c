/*
 * Host-emulation stand-in for CANN's kernel_operator.h (the single header Ascend C kernels
 * include). The CANN build never sees this directory; the g++ host build puts it first on the
 * include path. See emu_base.h for what is emulated and checked.
 */
#ifndef LYNX_EMU_KERNEL_OPERATOR_H
#define LYNX_EMU_KERNEL_OPERATOR_H

#include "emu_base.h"
#include "emu_tensor.h"
#include "emu_pipe.h"
#include "emu_datacopy.h"
#include "emu_vector.h"
#include "emu_launch.h"

#endif  // LYNX_EMU_KERNEL_OPERATOR_H
