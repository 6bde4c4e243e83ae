/* The "providers" schema of the shared store (ADR 0035 and 0037 amendments): the accounts'
 * limits state and the unbound keys' sticky account choices, shared by every host.
 *
 * A file of its own so that olp-keys (store init) links this and nothing else of
 * providers/. The tables are read and written by providers/pg.c.
 *
 * - olp_account_limits: the latest state per (provider, account), as JSON (pg.c encodes
 *   and decodes it: a layout every host of any build reads by name). seen_ms is the wall
 *   clock of the answer it came from: an upsert never replaces newer news with older.
 * - olp_account_choices: the account an unbound key uses per provider and until when.
 *   olp_account_choose() makes the choice once for every host: the first INSERT wins, a
 *   choice is replaced only when it has lapsed or when its account is still the one the
 *   caller saw rejected (compare and set), under the row's lock.
 * - Every change NOTIFYs olp_providers at commit, its payload the whole row as JSON, so a
 *   host's cache is brought up to date without a query. gen (one sequence for both
 *   tables) orders a row's versions: a cache keeps the highest it saw. */
#include <stddef.h>

#include "common/common.h"
#include "store/store.h"
#include "providers/providers.h"
#include "common/banned.h"

static const char *const providers_steps[] = {
	/* version 1 */
	"CREATE SEQUENCE olp_providers_gen;"
	"CREATE TABLE olp_account_limits ("
	" provider text NOT NULL,"
	" account text NOT NULL,"
	" gen bigint NOT NULL DEFAULT nextval('olp_providers_gen'),"
	" seen_ms bigint NOT NULL,"
	" state jsonb NOT NULL CHECK (jsonb_typeof(state) = 'object'),"
	" host text NOT NULL DEFAULT '',"
	" PRIMARY KEY (provider, account));"
	"CREATE TABLE olp_account_choices ("
	" provider text NOT NULL,"
	" key_id text NOT NULL,"
	" account text NOT NULL,"
	" until bigint NOT NULL,"
	" gen bigint NOT NULL DEFAULT nextval('olp_providers_gen'),"
	" PRIMARY KEY (provider, key_id));"
	"CREATE FUNCTION olp_providers_notify() RETURNS trigger LANGUAGE plpgsql AS $$"
	" BEGIN"
	"  IF TG_TABLE_NAME = 'olp_account_limits' THEN"
	"   IF TG_OP = 'DELETE' THEN"
	"    PERFORM pg_notify('olp_providers', json_build_object('t', 'l',"
	"     'p', OLD.provider, 'a', OLD.account)::text);"
	"    RETURN OLD;"
	"   END IF;"
	"   PERFORM pg_notify('olp_providers', json_build_object('t', 'l',"
	"    'p', NEW.provider, 'a', NEW.account, 'g', NEW.gen, 's', NEW.state)::text);"
	"   RETURN NEW;"
	"  END IF;"
	"  IF TG_OP = 'DELETE' THEN"
	"   PERFORM pg_notify('olp_providers', json_build_object('t', 'c',"
	"    'p', OLD.provider, 'k', OLD.key_id)::text);"
	"   RETURN OLD;"
	"  END IF;"
	"  PERFORM pg_notify('olp_providers', json_build_object('t', 'c',"
	"   'p', NEW.provider, 'k', NEW.key_id, 'a', NEW.account, 'u', NEW.until,"
	"   'g', NEW.gen)::text);"
	"  RETURN NEW;"
	" END $$;"
	"CREATE TRIGGER olp_account_limits_notify AFTER INSERT OR UPDATE OR DELETE"
	" ON olp_account_limits FOR EACH ROW EXECUTE FUNCTION olp_providers_notify();"
	"CREATE TRIGGER olp_account_choices_notify AFTER INSERT OR UPDATE OR DELETE"
	" ON olp_account_choices FOR EACH ROW EXECUTE FUNCTION olp_providers_notify();"
	/* p, k: the provider and key; a: the account the caller would choose, until u;
	 * now_s: the caller's clock; old: the account the caller saw kept and cannot use
	 * (rejected), or NULL. The kept row, after any change this made. */
	"CREATE FUNCTION olp_account_choose(p text, k text, a text, u bigint, now_s bigint,"
	"  old text, OUT o_account text, OUT o_until bigint, OUT o_gen bigint)"
	" LANGUAGE plpgsql AS $$"
	" BEGIN"
	"  FOR i IN 1..3 LOOP"
	"   INSERT INTO olp_account_choices AS c (provider, key_id, account, until)"
	"    VALUES (p, k, a, u) ON CONFLICT (provider, key_id) DO NOTHING"
	"    RETURNING c.account, c.until, c.gen INTO o_account, o_until, o_gen;"
	"   IF FOUND THEN RETURN; END IF;"
	"   SELECT c.account, c.until, c.gen INTO o_account, o_until, o_gen"
	"    FROM olp_account_choices c WHERE c.provider = p AND c.key_id = k FOR UPDATE;"
	"   IF FOUND THEN"
	"    IF o_until <= now_s OR (old IS NOT NULL AND o_account = old) THEN"
	"     UPDATE olp_account_choices c SET account = a, until = u,"
	"      gen = nextval('olp_providers_gen') WHERE c.provider = p AND c.key_id = k"
	"      RETURNING c.account, c.until, c.gen INTO o_account, o_until, o_gen;"
	"    END IF;"
	"    RETURN;"
	"   END IF;"
	/* Deleted between the two statements (a prune): insert again. */
	"  END LOOP;"
	"  RAISE EXCEPTION 'olp_account_choose: the row kept changing';"
	" END $$;",
};

static const struct store_schema providers_schema = {
	.module = "providers",
	.step = providers_steps,
	.n = ARRAY_SIZE(providers_steps),
};

const struct store_schema *prov_pg_schema(void)
{
	return &providers_schema;
}
