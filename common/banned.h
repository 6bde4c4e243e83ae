/* Functions that are easy to misuse are compile errors in our code (after git's banned.h).
 * Include this last in every .c file. */
#ifndef OLP_BANNED_H
#define OLP_BANNED_H

#define BANNED(func) sorry_##func##_is_a_banned_function

#undef strcpy
#define strcpy(x, y) BANNED(strcpy)
#undef strcat
#define strcat(x, y) BANNED(strcat)
#undef strncpy
#define strncpy(x, y, n) BANNED(strncpy)
#undef strncat
#define strncat(x, y, n) BANNED(strncat)
#undef sprintf
#define sprintf(...) BANNED(sprintf)
#undef vsprintf
#define vsprintf(...) BANNED(vsprintf)
#undef strtok
#define strtok(x, y) BANNED(strtok)
#undef gets
#define gets(x) BANNED(gets)
/* The worker is threaded: these share static state between threads (use gmtime_r,
 * localtime_r, strtok_r's absence: parse by hand, mkstemp/mkdtemp). */
#undef gmtime
#define gmtime(t) BANNED(gmtime)
#undef localtime
#define localtime(t) BANNED(localtime)
#undef ctime
#define ctime(t) BANNED(ctime)
#undef asctime
#define asctime(t) BANNED(asctime)
#undef strtok_r
#define strtok_r(s, d, p) BANNED(strtok_r)
#undef mktemp
#define mktemp(t) BANNED(mktemp)

#endif
