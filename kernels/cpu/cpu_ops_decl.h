/* cpu_ops_decl.h - included once per precision by cpu_ops.h; no guard. */
#include "attn_decl.h"
#include "layers_decl.h"
