/* JSON numbers as integers: the one checked conversion every module uses. Kept out of
 * util.c so that programs without jansson (the static olp-sandbox) link olp_common as
 * before; olp_common_json brings jansson with it. */
#include <errno.h>
#include <jansson.h>
#include <math.h>

#include "common/common.h"
#include "common/banned.h"

int parse_json_int(const json_t *v, int64_t min, int64_t max, int64_t *out)
{
	int64_t i;

	if (json_is_integer(v)) {
		i = json_integer_value(v);
	} else if (json_is_real(v)) {
		double d = json_real_value(v);

		if (isnan(d) || d != trunc(d))
			return -EINVAL;
		/* Both bounds are powers of two, exact as doubles: anything outside them
		 * (4e29, inf) would make the cast undefined behaviour. */
		if (d < -0x1p63 || d >= 0x1p63)
			return -ERANGE;
		i = (int64_t)d;
	} else {
		return -EINVAL;
	}
	if (i < min || i > max)
		return -ERANGE;
	*out = i;
	return 0;
}
