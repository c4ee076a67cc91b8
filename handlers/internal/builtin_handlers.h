// The built-in update rules, already validated: handler.cc parses and checks
// the parameters, these only compute. Not for use outside handlers/.
#ifndef DOWNPOUR_HANDLERS_INTERNAL_BUILTIN_HANDLERS_H_
#define DOWNPOUR_HANDLERS_INTERNAL_BUILTIN_HANDLERS_H_

#include <memory>

#include "handlers/handler.h"

namespace downpour {
namespace handlers_internal {

std::unique_ptr<UpdateHandler> NewAssignHandler();
std::unique_ptr<UpdateHandler> NewSumHandler();
std::unique_ptr<UpdateHandler> NewSgdHandler(float learning_rate);
std::unique_ptr<UpdateHandler> NewMomentumHandler(float learning_rate,
                                                  float momentum);
std::unique_ptr<UpdateHandler> NewAdagradHandler(float learning_rate,
                                                 float initial_accumulator,
                                                 float epsilon);
// One accumulator per row (TorchRec / FBGEMM's row-wise Adagrad).
std::unique_ptr<UpdateHandler> NewRowwiseAdagradHandler(
    float learning_rate, float initial_accumulator, float epsilon);
// beta1 and beta2 stay double: the bias corrections 1 - beta^t are computed
// in double, once per row (until they round to 1).
std::unique_ptr<UpdateHandler> NewAdamHandler(float learning_rate, double beta1,
                                              double beta2, float epsilon);
std::unique_ptr<UpdateHandler> NewFtrlHandler(float alpha, float beta, float l1,
                                              float l2);

}  // namespace handlers_internal
}  // namespace downpour

#endif  // DOWNPOUR_HANDLERS_INTERNAL_BUILTIN_HANDLERS_H_
