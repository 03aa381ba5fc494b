/* api_use.h - the routes that use a trained checkpoint (daemon/api_use.c):
 * POST /api/v1/sample and POST /api/v1/eval. apiHandle (api.c) calls them
 * with a fresh response; each answers an error or a 200 whose body is the
 * stream res->stream (JSON lines). */
#ifndef NSAD_API_USE_H
#define NSAD_API_USE_H

#include "api.h"

void apiUseSample(Service *svc, const ApiRequest *req, ApiResponse *res);
void apiUseEval(Service *svc, const ApiRequest *req, ApiResponse *res);

#endif
