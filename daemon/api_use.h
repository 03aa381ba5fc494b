/* api_use.h - the routes that use a trained checkpoint (daemon/api_use.c):
 * POST /api/v1/sample, /api/v1/eval and /api/v1/export, and GET
 * /api/v1/exports/NAME/FILE. apiHandle (api.c) calls them with a fresh
 * response; the POSTs answer an error or a 200 whose body is the stream
 * res->stream (JSON lines). */
#ifndef NSAD_API_USE_H
#define NSAD_API_USE_H

#include "api.h"

/* POST /api/v1/sample: queues a generation from a run's or a checkpoint's
 * weights (body: run or checkpoint, the prompt as text (prompt) or as
 * token ids (prompt_ids), and the sampling options) on the inference
 * worker; the stream sends the text, or the new token ids, as they come. A
 * bad body is answered 400 naming the field, an unknown run or a missing
 * checkpoint 404, no worker or a full queue 503: nothing is queued then.
 * What only the model can tell (an id outside its vocabulary, a text
 * prompt to a model with no text form) and errors during generation end
 * the stream with an error line. */
void apiUseSample(Service *svc, const ApiRequest *req, ApiResponse *res);
/* POST /api/v1/eval: queues held-out loss and bits per byte of a run's or
 * a checkpoint's weights on a data file; the stream sends progress lines,
 * then the result. Errors as apiUseSample. */
void apiUseEval(Service *svc, const ApiRequest *req, ApiResponse *res);
/* POST /api/v1/export: queues the export of a run's or a checkpoint's
 * weights (body: run or checkpoint, dtype "bf16" (default) or "f32") into
 * the state dir's exports (daemon/exportstore.h); the stream sends a start
 * line, then done with the export's name and files. Errors as
 * apiUseSample. */
void apiUseExport(Service *svc, const ApiRequest *req, ApiResponse *res);
/* GET /api/v1/exports/NAME/FILE (rest: "NAME/FILE"): one file of an export,
 * its bytes as they are on disk; 404 naming what is unknown. */
void apiUseExportFile(Service *svc, const ApiRequest *req, ApiResponse *res, const char *rest);

#endif
