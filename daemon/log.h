/* log.h - nsad's log lines on stderr.
 *
 * When stderr is the journal (systemd's JOURNAL_STREAM names its device and
 * inode) each line starts with a syslog priority prefix "<N>"
 * (sd-daemon(3)), which journald turns into the entry's priority and
 * strips. Anywhere else - a terminal, a pipe, a file - a person reads the
 * lines, so they start with a timestamp and a short level word instead.
 * Thread-safe: one write(2) per line. */
#ifndef NSAD_LOG_H
#define NSAD_LOG_H

enum { LOG_LVL_ERR = 3, LOG_LVL_WARNING = 4, LOG_LVL_NOTICE = 5, LOG_LVL_INFO = 6, LOG_LVL_DEBUG = 7 };

/* Lines above this priority number are dropped (default LOG_LVL_INFO). */
void logSetLevel(int level);
void logMsg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define logError(...) logMsg(LOG_LVL_ERR, __VA_ARGS__)
#define logWarn(...) logMsg(LOG_LVL_WARNING, __VA_ARGS__)
#define logNotice(...) logMsg(LOG_LVL_NOTICE, __VA_ARGS__)
#define logInfo(...) logMsg(LOG_LVL_INFO, __VA_ARGS__)
#define logDebug(...) logMsg(LOG_LVL_DEBUG, __VA_ARGS__)

#endif
