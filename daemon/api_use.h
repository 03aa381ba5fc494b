/* api_use.h - the routes that use a trained checkpoint (daemon/api_use.c):
 * POST /api/v1/sample and POST /api/v1/eval. apiHandle (api.c) calls them
 * with a fresh response; each answers an error or a 200 whose body is the
 * stream res->stream (JSON lines). */
#ifndef NSAD_API_USE_H
#define NSAD_API_USE_H

#include "api.h"

/* POST /api/v1/sample: queues a generation from a run's or a checkpoint's
 * weights (body: run or checkpoint, prompt and the sampling options) on the
 * inference worker; the stream sends the text as it comes. A bad body is
 * answered 400 naming the field, an unknown run or a missing checkpoint
 * 404, no worker or a full queue 503: nothing is queued then. Errors during
 * generation end the stream with an error line. */
void apiUseSample(Service *svc, const ApiRequest *req, ApiResponse *res);
/* POST /api/v1/eval: queues held-out loss and bits per byte of a run's or
 * a checkpoint's weights on a data file; the stream sends progress lines,
 * then the result. Errors as apiUseSample. */
void apiUseEval(Service *svc, const ApiRequest *req, ApiResponse *res);

#endif
