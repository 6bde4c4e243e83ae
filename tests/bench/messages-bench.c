/* messages-bench: the CPU the Messages front-end adds to a request, in-process, away from
 * the noise of a round trip (api-bench.sh runs it after its HTTP rounds).
 *
 * A request the size of Claude Code's (a 20 KB system prompt, 12 tools with 3 KB schemas,
 * a tool round trip in the history: about 60 KB) is parsed as /v1/messages does it
 * (json_loadb, fcgi_messages_translate, fcgi_chat_parse_json) and, translated, as
 * /v1/chat/completions does it (fcgi_chat_parse); an answer of 100 deltas is encoded as
 * Messages events and as chat chunks. Reported: the median of each over the rounds, and
 * what the Messages side costs more.
 *
 * usage: messages-bench [ROUNDS]   (default 2000) */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fcgi/fcgi.h"
#include "tests/bench/stats.h"
#include "common/banned.h"

static json_t *big_request(void)
{
	json_t *root = json_object(), *tools = json_array(), *msgs = json_array(), *props;
	struct buf s = BUF_INIT;
	char name[16];

	for (int i = 0; i < 400; i++)
		buf_adds(&s, "You are an agent working with the user toward their goals. ");
	json_object_set_new(root, "model", json_string("claude-opus-5-5"));
	json_object_set_new(root, "max_tokens", json_integer(128000));
	json_object_set_new(root, "stream", json_true());
	json_object_set_new(root, "system",
			    json_pack("[{s:s, s:s, s:{s:s}}]", "type", "text", "text", s.data,
				      "cache_control", "type", "ephemeral"));
	for (int i = 0; i < 12; i++) {
		props = json_object();
		for (int p = 0; p < 12; p++) {
			snprintf(name, sizeof(name), "p%d", p);
			json_object_set_new(props, name,
					    json_pack("{s:s, s:s%}", "type", "string",
						      "description", s.data, (size_t)200));
		}
		snprintf(name, sizeof(name), "Tool%d", i);
		json_array_append_new(tools,
				      json_pack("{s:s, s:s%, s:{s:s, s:o}}", "name", name,
						"description", s.data, (size_t)600, "input_schema",
						"type", "object", "properties", props));
	}
	json_object_set_new(root, "tools", tools);
	json_array_append_new(msgs, json_pack("{s:s, s:[{s:s, s:s}]}", "role", "user", "content",
					      "type", "text", "text", "list the files"));
	json_array_append_new(msgs, json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:s, s:s, s:{s:s}}]}",
					      "role", "assistant", "content", "type", "text",
					      "text", "Listing.", "type", "tool_use", "id",
					      "toolu_1", "name", "Tool1", "input", "p0", "ls"));
	json_array_append_new(msgs, json_pack("{s:s, s:[{s:s, s:s, s:s}]}", "role", "user",
					      "content", "type", "tool_result", "tool_use_id",
					      "toolu_1", "content", "a\nb\nc\n"));
	json_object_set_new(root, "messages", msgs);
	buf_release(&s);
	return root;
}

static double median_us(uint64_t *ns, size_t n)
{
	return bench_quantile(ns, n, 0.5) / 1e3;
}

int main(int argc, char **argv)
{
	size_t rounds = argc > 1 ? strtoul(argv[1], NULL, 10) : 2000;
	uint64_t *t = calloc(4 * (rounds ? rounds : 1), sizeof(*t));
	uint64_t *tm = t, *tc = t + rounds, *em = t + 2 * rounds, *ec = t + 3 * rounds;
	json_t *req = big_request(), *chat;
	char *body = json_dumps(req, JSON_COMPACT), *chat_body = NULL;
	struct fcgi_error err = { 0 };
	struct fcgi_chat_request cr;
	struct fcgi_completion meta;
	struct fcgi_msg_stream st;
	struct buf out = BUF_INIT;
	size_t len = body ? strlen(body) : 0, i;
	int ret = 1;

	chat = fcgi_messages_translate(req, false, &err);
	if (!rounds || !t || !body || !chat) {
		fprintf(stderr, "messages-bench: %s\n", chat ? "bad arguments" : err.message);
		goto out;
	}
	chat_body = json_dumps(chat, JSON_COMPACT);
	json_decref(chat);
	for (i = 0; chat_body && i < rounds; i++) {
		uint64_t t0 = mono_ns();
		json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL);

		chat = fcgi_messages_translate(root, false, &err);
		json_decref(root);
		if (!chat || fcgi_chat_parse_json(chat, &cr, &err))
			goto out_failed;
		fcgi_chat_release(&cr);
		tm[i] = mono_ns() - t0;
		t0 = mono_ns();
		if (fcgi_chat_parse(chat_body, strlen(chat_body), &cr, &err))
			goto out_failed;
		fcgi_chat_release(&cr);
		tc[i] = mono_ns() - t0;

		t0 = mono_ns();
		fcgi_msg_stream_init(&st, "claude-opus-5-5");
		for (int d = 0; d < 100; d++) {
			buf_reset(&out);
			fcgi_msg_sse_text(&st, &out, "a few words ", 12);
		}
		buf_reset(&out);
		fcgi_msg_sse_end(&st, &out, "end_turn", NULL, NULL);
		em[i] = mono_ns() - t0;
		t0 = mono_ns();
		fcgi_completion_init(&meta, "claude-opus-5-5");
		for (int d = 0; d < 100; d++) {
			buf_reset(&out);
			fcgi_sse_chunk(&out, &meta, d ? NULL : "assistant", "a few words ", 12,
				       NULL);
		}
		buf_reset(&out);
		fcgi_sse_chunk(&out, &meta, NULL, NULL, 0, "stop");
		fcgi_sse_done(&out);
		ec[i] = mono_ns() - t0;
	}
	if (!chat_body)
		goto out;
	printf("request_bytes %zu\n", len);
	printf("parse_messages_median_us %.1f\n", median_us(tm, rounds));
	printf("parse_chat_median_us %.1f\n", median_us(tc, rounds));
	printf("encode_messages_100_deltas_median_us %.1f\n", median_us(em, rounds));
	printf("encode_chat_100_deltas_median_us %.1f\n", median_us(ec, rounds));
	printf("messages_minus_chat_us %.1f (goal <= 1000)\n",
	       median_us(tm, rounds) - median_us(tc, rounds) + median_us(em, rounds) -
		       median_us(ec, rounds));
	ret = 0;
	goto out;
out_failed:
	fprintf(stderr, "messages-bench: the request was refused: %s\n", err.message);
out:
	buf_release(&out);
	free(body);
	free(chat_body);
	json_decref(req);
	free(t);
	return ret;
}
