//===- ETensorOps.td - Python bindings of etensor ops ------*- tablegen -*-===//

#ifndef ETC_PYTHON_DIALECTS_ETENSOROPS_TD
#define ETC_PYTHON_DIALECTS_ETENSOROPS_TD

include "etc/Dialect/ETensor/IR/ETensorOps.td"

#endif // ETC_PYTHON_DIALECTS_ETENSOROPS_TD
